// streamtts player: native WebSocket protocol (/v1/stream) -> AudioWorklet ring buffer.
// No build step; plain ES module. Protocol: docs in DESIGN.md section 2.1.

const MIN_RATE = 8000;
const MAX_RATE = 48000;
const BYTES_PER_SAMPLE = 4; // pcm_f32le, mono
const MAX_TEXT_MESSAGE_CHARS = 4000; // well under the server's per-message limit
const LOG_LIMIT = 300; // entries kept in the on-page log
const TOKEN_CHARS = [1, 7]; // simulated LLM token size range, characters
const TOKEN_DELAY_MS = [30, 60]; // simulated LLM token interval range

const $ = (id) => document.getElementById(id);
const utf8 = new TextDecoder();

// Test hook: live, mutated in place. Per-utterance fields reset on every Speak.
const stats = {
  state: "idle", // idle | connecting | waiting | streaming | cancelling | done | cancelled | error
  context: null, // id of the current utterance's context
  sampleRate: null, // Hz of the audio being received
  firstAudioMs: null, // client-side: text sent -> first audio byte
  bytesReceived: 0, // audio payload bytes of the current context
  audioMs: 0, // duration of that audio
  underruns: 0,
  playedMs: 0, // audio the worklet has played so far
  lastDone: null, // last `done` message, as received
  lateBytes: 0, // audio received for a context after its `done` (a server bug if > 0)
  errors: [], // `error` messages from the server
};
window.streamttsStats = stats;

let audio = null; // {ctx, node, rate}; created on the first Speak (a user gesture)
let socket = null; // {ws, token, ready: Promise<WebSocket>}
let contextCounter = 0;
const contexts = new Map(); // id -> utterance state
let current = null; // the utterance shown on the page

// ---------------------------------------------------------------- audio

const clampRate = (rate) => Math.min(MAX_RATE, Math.max(MIN_RATE, Math.round(rate)));

async function ensureAudio() {
  if (audio) {
    if (audio.ctx && audio.ctx.state === "suspended") audio.ctx.resume().catch(() => {});
    return audio;
  }
  let ctx = null;
  let node = null;
  try {
    ctx = new AudioContext({ latencyHint: "interactive" });
    if (ctx.sampleRate !== clampRate(ctx.sampleRate)) {
      const rate = clampRate(ctx.sampleRate);
      await ctx.close();
      ctx = new AudioContext({ latencyHint: "interactive", sampleRate: rate });
    }
    if (!ctx.audioWorklet) throw new Error("AudioWorklet needs a secure context (https or localhost)");
    await ctx.audioWorklet.addModule(new URL("player-worklet.js", import.meta.url));
    node = new AudioWorkletNode(ctx, "streamtts-player", {
      numberOfInputs: 0,
      outputChannelCount: [1],
    });
    node.port.onmessage = (event) => onWorkletMessage(event.data);
    node.connect(ctx.destination);
    ctx.resume().catch(() => {});
  } catch (err) {
    log("error", `audio playback unavailable (${err.message}); still receiving`);
    node = null;
  }
  audio = { ctx, node, rate: clampRate(ctx ? ctx.sampleRate : MAX_RATE) };
  return audio;
}

function toWorklet(msg, transfer = []) {
  if (audio && audio.node) audio.node.port.postMessage(msg, transfer);
}

function onWorkletMessage(msg) {
  if (!current) return;
  if (msg.type === "underrun") {
    stats.underruns = msg.underruns;
    $("stat-underruns").textContent = String(msg.underruns);
  } else if (msg.type === "position" || msg.type === "drained") {
    stats.playedMs = Math.round((msg.playedFrames / audio.rate) * 1000);
    highlightCaptions(msg.type === "drained" ? Infinity : stats.playedMs);
  }
}

// ---------------------------------------------------------------- connection

function streamUrl(token) {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const query = token ? `?token=${encodeURIComponent(token)}` : "";
  return `${scheme}//${location.host}/v1/stream${query}`;
}

function connect() {
  const token = $("token").value.trim();
  if (socket && socket.token === token && socket.ws.readyState <= WebSocket.OPEN) return socket.ready;
  if (socket) socket.ws.close(1000);

  const ws = new WebSocket(streamUrl(token));
  ws.binaryType = "arraybuffer";
  const ready = new Promise((resolve, reject) => {
    ws.onopen = () => {
      setStatus("Connected");
      resolve(ws);
    };
    ws.onclose = (event) => {
      reject(new Error(`connection closed (${event.code})`));
      onClose(ws, event);
    };
  });
  ws.onmessage = (event) => {
    if (typeof event.data === "string") onControl(event.data);
    else onAudio(event.data);
  };
  socket = { ws, token, ready };
  setStatus("Connecting…");
  return ready;
}

function onClose(ws, event) {
  const reason = event.reason ? `: ${event.reason}` : "";
  log(event.code === 1000 ? "info" : "error", `socket closed ${event.code}${reason}`);
  if (socket && socket.ws === ws) {
    socket = null;
    setStatus(`Disconnected (${event.code}${reason})`);
  }
  for (const c of contexts.values()) {
    if (c.done || c.ws !== ws) continue;
    c.done = true;
    stopTokens(c);
    if (c === current) {
      toWorklet({ type: "end" });
      finish("error");
    }
  }
}

function send(ws, msg, quiet = false) {
  if (ws.readyState !== WebSocket.OPEN) return false;
  ws.send(JSON.stringify(msg));
  if (!quiet) log("out", JSON.stringify(msg));
  return true;
}

// ---------------------------------------------------------------- server messages

function onControl(text) {
  let msg;
  try {
    msg = JSON.parse(text);
  } catch {
    log("error", `unparsable message: ${text.slice(0, 200)}`);
    return;
  }
  log(msg.type === "error" ? "error" : "in", text.length > 400 ? `${text.slice(0, 400)}…` : text);
  const c = contexts.get(msg.context);
  switch (msg.type) {
    case "started":
      if (!c) return;
      if (msg.encoding !== "pcm_f32le" || msg.sample_rate !== audio.rate) {
        log("error", `server chose ${msg.encoding} @ ${msg.sample_rate} Hz; asked pcm_f32le @ ${audio.rate} Hz`);
      }
      c.sampleRate = msg.sample_rate;
      if (c === current) stats.sampleRate = msg.sample_rate;
      break;
    case "segment":
      if (c && c === current && !c.cancelled) addCaption(msg);
      break;
    case "done":
      stats.lastDone = msg;
      if (!c) return;
      c.done = true;
      stopTokens(c);
      if (c !== current) return;
      showServerStats(msg.stats || {});
      toWorklet({ type: msg.reason === "cancel" ? "clear" : "end" });
      finish(msg.reason === "cancel" ? "cancelled" : msg.reason === "end" ? "done" : "error");
      break;
    case "error":
      stats.errors.push(msg);
      // A rejected `start` leaves no context behind; later errors are followed by `done`.
      if (c && !c.done && c.sampleRate === null) {
        c.done = true;
        stopTokens(c);
        if (c === current) {
          toWorklet({ type: "end" });
          finish("error");
        }
      }
      break;
    default: // "flushed" and anything newer: logged above
      break;
  }
}

function onAudio(buffer) {
  const bytes = new Uint8Array(buffer);
  if (bytes.length === 0) return;
  const n = bytes[0];
  const id = utf8.decode(bytes.subarray(1, 1 + n));
  const c = contexts.get(id);
  let payload = bytes.subarray(1 + n);
  if (!c) {
    log("error", `audio for unknown context ${JSON.stringify(id)}`);
    return;
  }
  if (c.done) {
    stats.lateBytes += payload.length;
    return;
  }
  if (c.cancelled || payload.length === 0) return; // barge-in: drop what was in flight

  if (c.firstAudioAt === null) {
    c.firstAudioAt = performance.now();
    if (c === current) {
      stats.firstAudioMs = Math.round((c.firstAudioAt - c.sentAt) * 10) / 10;
      $("stat-ttfa").textContent = `${Math.round(stats.firstAudioMs)} ms`;
      setState("streaming");
    }
    log("in", `first audio for ${id}: ${payload.length} bytes`);
  }
  c.bytes += payload.length;
  if (c !== current) return;
  stats.bytesReceived = c.bytes;
  stats.audioMs = Math.round((c.bytes / BYTES_PER_SAMPLE / (c.sampleRate || audio.rate)) * 1000);
  $("stat-audio").textContent = `${(stats.audioMs / 1000).toFixed(2)} s (${(c.bytes / 1024).toFixed(0)} KiB)`;

  // A float may straddle two frames; carry the odd bytes over.
  if (c.carry) {
    const joined = new Uint8Array(c.carry.length + payload.length);
    joined.set(c.carry);
    joined.set(payload, c.carry.length);
    payload = joined;
    c.carry = null;
  }
  const whole = payload.length - (payload.length % BYTES_PER_SAMPLE);
  if (whole < payload.length) c.carry = payload.slice(whole);
  if (whole === 0) return;
  const samples = new Float32Array(payload.slice(0, whole).buffer); // little-endian host
  toWorklet({ type: "audio", samples }, [samples.buffer]);
}

// ---------------------------------------------------------------- speaking

async function speak() {
  const text = $("text").value.trim();
  if (!text) {
    log("error", "nothing to speak");
    $("text").focus();
    return;
  }
  if (current && !current.done) cancel(current);
  $("speak").disabled = true;
  resetStats();
  setState("connecting");
  try {
    const { rate } = await ensureAudio();
    const ws = await connect();
    const id = `c${++contextCounter}`;
    const c = {
      id, ws, sentAt: 0, firstAudioAt: null, bytes: 0, carry: null,
      sampleRate: null, cancelled: false, done: false, timer: null,
    };
    contexts.set(id, c);
    current = c;
    stats.context = id;
    toWorklet({ type: "begin" });
    send(ws, {
      type: "start",
      context: id,
      voice: $("voice").value,
      format: { encoding: "pcm_f32le", sample_rate: rate },
    });
    setState("waiting");
    $("stop").disabled = false;
    if ($("simulate").checked) {
      streamTokens(c, text);
    } else {
      c.sentAt = performance.now();
      for (let i = 0; i < text.length; i += MAX_TEXT_MESSAGE_CHARS) {
        send(ws, { type: "text", context: id, text: text.slice(i, i + MAX_TEXT_MESSAGE_CHARS) });
      }
      send(ws, { type: "end", context: id });
    }
  } catch (err) {
    log("error", err.message);
    setState("error");
  } finally {
    $("speak").disabled = false;
  }
}

// Feed the text as an LLM would: small random pieces every 30-60 ms, then `end`.
function streamTokens(c, text) {
  const between = ([lo, hi]) => lo + Math.floor(Math.random() * (hi - lo + 1));
  let pos = 0;
  let pieces = 0;
  const next = () => {
    c.timer = null;
    if (c.cancelled || c.done) return;
    if (pos >= text.length) {
      log("out", `(${pieces} text pieces)`);
      send(c.ws, { type: "end", context: c.id });
      return;
    }
    const piece = text.slice(pos, pos + between(TOKEN_CHARS));
    pos += piece.length;
    if (pieces++ === 0) c.sentAt = performance.now();
    send(c.ws, { type: "text", context: c.id, text: piece }, pieces > 1);
    c.timer = setTimeout(next, between(TOKEN_DELAY_MS));
  };
  next();
}

function stopTokens(c) {
  if (c.timer !== null) clearTimeout(c.timer);
  c.timer = null;
}

// Barge-in: silence now, tell the server, drop whatever audio is still in flight.
function cancel(c) {
  if (c.cancelled || c.done) return;
  c.cancelled = true;
  stopTokens(c);
  toWorklet({ type: "clear" });
  send(c.ws, { type: "cancel", context: c.id });
  if (c === current) setState("cancelling");
  $("stop").disabled = true;
}

function finish(state) {
  setState(state);
  $("stop").disabled = true;
}

// ---------------------------------------------------------------- view

function resetStats() {
  Object.assign(stats, {
    context: null, sampleRate: null, firstAudioMs: null, bytesReceived: 0,
    audioMs: 0, underruns: 0, playedMs: 0, lastDone: null,
  });
  for (const id of ["stat-ttfa", "stat-server-ttfa", "stat-rtf", "stat-audio"]) $(id).textContent = "–";
  $("stat-underruns").textContent = "0";
  $("captions").replaceChildren();
}

function setState(state) {
  stats.state = state;
  $("stat-state").textContent = state;
}

function setStatus(text) {
  $("status").textContent = text;
}

function showServerStats(s) {
  if (typeof s.ttfa_ms === "number") $("stat-server-ttfa").textContent = `${Math.round(s.ttfa_ms)} ms`;
  if (typeof s.rtf === "number") $("stat-rtf").textContent = s.rtf.toFixed(3);
}

function addCaption(seg) {
  const span = document.createElement("span");
  span.textContent = `${seg.text} `;
  span.dataset.start = seg.start_ms;
  span.dataset.end = seg.end_ms;
  $("captions").append(span);
}

function highlightCaptions(playedMs) {
  for (const span of $("captions").children) {
    const start = Number(span.dataset.start);
    const end = Number(span.dataset.end);
    span.classList.toggle("spoken", playedMs >= end);
    span.classList.toggle("current", playedMs >= start && playedMs < end);
  }
}

function log(kind, text) {
  const list = $("log");
  const nearBottom = list.scrollTop + list.clientHeight >= list.scrollHeight - 8;
  const item = document.createElement("li");
  item.className = kind;
  const time = document.createElement("time");
  time.textContent = new Date().toISOString().slice(11, 23);
  const arrow = { in: "←", out: "→", error: "!", info: "·" }[kind];
  item.append(time, ` ${arrow} ${text}`);
  list.append(item);
  while (list.children.length > LOG_LIMIT) list.firstElementChild.remove();
  if (nearBottom) list.scrollTop = list.scrollHeight;
}

// ---------------------------------------------------------------- voices, wiring

function authHeaders() {
  const token = $("token").value.trim();
  return token ? { Authorization: `Bearer ${token}` } : {};
}

async function loadVoices(select_id = null) {
  try {
    const res = await fetch("/v1/voices", { headers: authHeaders() });
    if (!res.ok) throw new Error(`HTTP ${res.status}`);
    const body = await res.json();
    const select = $("voice");
    const keep = select_id || select.value;
    select.replaceChildren();
    const list = $("voice-list");
    list.replaceChildren();
    for (const v of body.voices || []) {
      const details = [v.language, v.engine, v.cloned ? "cloned" : ""].filter(Boolean).join(", ");
      const label = `${v.name || v.id}${details ? ` (${details})` : ""}`;
      select.append(new Option(label, v.id, false, v.id === body.default));
      if (v.cloned) list.append(voiceItem(v));
    }
    if (select.options.length === 0) select.append(new Option("default", "default"));
    if (keep && [...select.options].some((o) => o.value === keep)) select.value = keep;
    log("info", `${select.options.length} voice(s)`);
  } catch (err) {
    log("error", `could not list voices: ${err.message}`);
  }
}

function voiceItem(v) {
  const item = document.createElement("li");
  item.dataset.voice = v.id;
  const label = document.createElement("span");
  label.textContent = `${v.name} (${v.id}, ${v.duration_s} s)`;
  const remove = document.createElement("button");
  remove.type = "button";
  remove.textContent = "Delete";
  remove.setAttribute("aria-label", `Delete voice ${v.name}`);
  remove.addEventListener("click", () => deleteVoice(v.id));
  item.append(label, remove);
  return item;
}

async function deleteVoice(id) {
  const res = await fetch(`/v1/voices/${encodeURIComponent(id)}`, {
    method: "DELETE",
    headers: authHeaders(),
  });
  if (res.status === 204) {
    log("info", `voice ${id} deleted`);
  } else {
    log("error", `could not delete ${id}: ${await errorText(res)}`);
  }
  await loadVoices();
}

async function errorText(res) {
  try {
    const body = await res.json();
    return body.error ? `${body.error.code}: ${body.error.message}` : `HTTP ${res.status}`;
  } catch {
    return `HTTP ${res.status}`;
  }
}

let recorded = null; // a Blob from the microphone, used when no file is chosen
let recorder = null;

async function toggleRecording() {
  const button = $("voice-record");
  if (recorder) {
    recorder.stop();
    return;
  }
  if (!navigator.mediaDevices || !window.MediaRecorder) {
    $("voice-status").textContent = "This browser cannot record here; choose a file.";
    return;
  }
  try {
    const stream = await navigator.mediaDevices.getUserMedia({ audio: true });
    const chunks = [];
    recorder = new MediaRecorder(stream);
    recorder.addEventListener("dataavailable", (e) => chunks.push(e.data));
    recorder.addEventListener("stop", () => {
      recorded = new Blob(chunks, { type: recorder.mimeType });
      stream.getTracks().forEach((t) => t.stop());
      recorder = null;
      button.textContent = "Record";
      $("voice-status").textContent = `Recorded ${(recorded.size / 1024).toFixed(0)} KB.`;
    });
    recorder.start();
    button.textContent = "Stop recording";
    $("voice-status").textContent = "Recording… read your transcript aloud.";
  } catch (err) {
    $("voice-status").textContent = `No microphone: ${err.message}`;
  }
}

async function addVoice() {
  const status = $("voice-status");
  const file = $("voice-audio").files[0];
  const audio = file || recorded;
  if (!audio) {
    status.textContent = "Choose a recording (or record one) first.";
    return;
  }
  const form = new FormData();
  form.append("audio", audio, file ? file.name : "recording.webm");
  form.append("text", $("voice-text").value);
  if ($("voice-name").value.trim()) form.append("name", $("voice-name").value.trim());
  $("voice-add").disabled = true;
  status.textContent = "Encoding the voice…";
  try {
    const res = await fetch("/v1/voices", { method: "POST", body: form, headers: authHeaders() });
    if (res.status !== 201) {
      status.textContent = `Not added: ${await errorText(res)}`;
      return;
    }
    const voice = await res.json();
    log("info", `voice ${voice.id} added`);
    $("voice-form").reset();
    recorded = null;
    await loadVoices(voice.id);
    // Said once the voice is listed and selected, so "Added" means ready to speak with.
    status.textContent = `Added ${voice.name} (${voice.id}).`;
  } finally {
    $("voice-add").disabled = false;
  }
}

$("speak-form").addEventListener("submit", (event) => {
  event.preventDefault();
  speak();
});
$("stop").addEventListener("click", () => {
  if (current) cancel(current);
});
$("text").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
    event.preventDefault();
    $("speak-form").requestSubmit();
  }
});
document.addEventListener("keydown", (event) => {
  if (event.key === "Escape" && current) cancel(current);
});
$("token").addEventListener("change", () => loadVoices());
$("voice-form").addEventListener("submit", (event) => {
  event.preventDefault();
  addVoice();
});
$("voice-record").addEventListener("click", toggleRecording);

loadVoices();
