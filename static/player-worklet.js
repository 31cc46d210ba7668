// AudioWorklet processor: a growable ring buffer of mono float32 samples, played gaplessly.
//
// Page -> processor (port messages):
//   {type: "begin"}                 a new stream starts (resets counters, "ended" flag)
//   {type: "audio", samples}        append a Float32Array (its buffer is transferred)
//   {type: "end"}                   no more audio will come for this stream
//   {type: "clear"}                 barge-in: drop everything buffered, now
// Processor -> page:
//   {type: "underrun", underruns}   the buffer ran dry while the stream was not ended
//   {type: "position", playedFrames, bufferedFrames}   about every 40 ms while playing
//   {type: "drained", playedFrames} everything of an ended stream has been played

const INITIAL_CAPACITY = 1 << 16; // samples; grows by doubling when the server runs ahead
const POSITION_EVERY = 16; // render quanta between position reports (16 x 128 frames)

class PlayerProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.ring = new Float32Array(INITIAL_CAPACITY);
    this.readIndex = 0;
    this.size = 0; // samples buffered
    this.reset();
    this.port.onmessage = (event) => this.onMessage(event.data);
  }

  reset() {
    this.readIndex = 0;
    this.size = 0;
    this.playing = false; // true once audio arrived and until the buffer runs dry
    this.ended = true; // nothing is streaming until "begin"
    this.underruns = 0;
    this.playedFrames = 0;
    this.quanta = 0;
  }

  onMessage(msg) {
    switch (msg.type) {
      case "begin":
        this.reset();
        this.ended = false;
        break;
      case "audio":
        this.write(msg.samples);
        break;
      case "end":
        this.ended = true;
        if (this.size === 0) this.port.postMessage({ type: "drained", playedFrames: this.playedFrames });
        break;
      case "clear":
        this.readIndex = 0;
        this.size = 0;
        this.playing = false;
        this.ended = true;
        break;
    }
  }

  write(samples) {
    if (this.size + samples.length > this.ring.length) this.grow(this.size + samples.length);
    const cap = this.ring.length;
    const writeIndex = (this.readIndex + this.size) % cap;
    const first = Math.min(samples.length, cap - writeIndex);
    this.ring.set(samples.subarray(0, first), writeIndex);
    if (first < samples.length) this.ring.set(samples.subarray(first), 0);
    this.size += samples.length;
    this.playing = true;
  }

  grow(needed) {
    let cap = this.ring.length;
    while (cap < needed) cap *= 2;
    const next = new Float32Array(cap);
    const old = this.ring;
    const first = Math.min(this.size, old.length - this.readIndex);
    next.set(old.subarray(this.readIndex, this.readIndex + first), 0);
    next.set(old.subarray(0, this.size - first), first);
    this.ring = next;
    this.readIndex = 0;
  }

  process(_inputs, outputs) {
    const out = outputs[0][0];
    const n = Math.min(out.length, this.size);
    const cap = this.ring.length;
    const first = Math.min(n, cap - this.readIndex);
    out.set(this.ring.subarray(this.readIndex, this.readIndex + first), 0);
    if (first < n) out.set(this.ring.subarray(0, n - first), first);
    out.fill(0, n); // silence for whatever is missing
    this.readIndex = (this.readIndex + n) % cap;
    this.size -= n;
    this.playedFrames += n;

    if (this.playing && this.size === 0) {
      this.playing = false;
      if (this.ended) {
        this.port.postMessage({ type: "drained", playedFrames: this.playedFrames });
      } else {
        this.underruns += 1;
        this.port.postMessage({ type: "underrun", underruns: this.underruns });
      }
    }
    if (n > 0 && ++this.quanta % POSITION_EVERY === 0) {
      this.port.postMessage({
        type: "position",
        playedFrames: this.playedFrames,
        bufferedFrames: this.size,
      });
    }
    return true; // keep the processor alive between utterances
  }
}

registerProcessor("streamtts-player", PlayerProcessor);
