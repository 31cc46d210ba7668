"""The deadline-first policy's parts on a fake clock: deadlines, leads, learned capacity."""

from __future__ import annotations

import pytest

from streamtts.scheduling import (
    LATE_MARGIN_S,
    OTHER_PIECE_SHARE,
    CostModel,
    PlaybackClock,
    SchedulingSettings,
    first_window_s,
    rest_is_late,
)

SETTINGS = SchedulingSettings(ttfa_target_s=0.25, max_lead_s=6.0)


def test_a_silent_stream_is_due_a_ttfa_target_after_its_work_arrives() -> None:
    clock = PlaybackClock()
    assert clock.deadline_s(10.0, SETTINGS) == 10.25 and clock.lead_s(10.0) == 0.0


def test_a_playing_stream_is_due_when_its_listener_runs_out() -> None:
    clock = PlaybackClock()
    clock.produced(2.0, now_s=10.0)  # 2 s of audio from t=10: it runs out at t=12
    clock.produced(1.0, now_s=10.5)
    assert clock.runs_out_s == 13.0
    assert clock.deadline_s(11.0, SETTINGS) == 13.0
    assert clock.lead_s(11.0) == 2.0
    # The listener heard everything and waits in silence: like a first audio again.
    assert clock.deadline_s(14.0, SETTINGS) == 14.25 and clock.lead_s(14.0) == 0.0
    assert not clock.far_ahead(11.0, SETTINGS)
    clock.produced(10.0, now_s=11.0)
    assert clock.far_ahead(11.0, SETTINGS)


def test_a_worker_pool_keeps_as_many_streams_as_its_threads_make_audio_for() -> None:
    model = CostModel(parallel=2)
    assert model.realtime_streams(100, 0.2) is None  # nothing measured yet
    model.observe(compute_s=0.1, audio_s=2.0)  # 20x faster than real time per thread
    assert model.realtime_streams(100, 0.2) == pytest.approx(2 * 0.8 * 20)
    assert model.realtime_streams(10, 0.2) == 10  # at most the limit
    for _ in range(30):  # the machine got slower: the estimate follows
        model.observe(compute_s=0.2, audio_s=2.0)
    assert model.realtime_streams(100, 0.2) == pytest.approx(16, rel=0.01)


def test_a_batching_engine_keeps_the_largest_batch_whose_step_is_fast_enough() -> None:
    model = CostModel()
    frame_s = 0.0464
    model.observe(compute_s=0.010, audio_s=frame_s, batch=1)
    model.observe(compute_s=0.040, audio_s=frame_s, batch=8)
    # Interpolated: batch b costs 10 + (b - 1) * 30/7 ms per 46.4 ms frame; 80% of real time
    # is 37.1 ms, reached between 7 and 8.
    assert model.cost(4) == pytest.approx((0.010 + 3 * 0.030 / 7) / frame_s)
    assert model.realtime_streams(8, 0.2) == 7
    assert model.realtime_streams(8, 0.0) == 8
    # Beyond the largest measured batch: no better than linear.
    assert model.cost(16) == pytest.approx(2 * model.cost(8))  # type: ignore[operator]


def test_an_engine_slower_than_real_time_keeps_no_stream_at_real_time() -> None:
    model = CostModel()
    model.observe(compute_s=0.2, audio_s=0.0464, batch=1)
    assert model.realtime_streams(4, 0.2) == 0.0


def test_bad_settings_are_refused() -> None:
    from streamtts.bounds import SettingsError

    with pytest.raises(SettingsError):
        SchedulingSettings(capacity_headroom=1.0)
    with pytest.raises(SettingsError):
        SchedulingSettings(max_send_ahead_ms=10)


def test_a_listener_who_ran_out_resumes_at_the_next_audio() -> None:
    clock = PlaybackClock()
    clock.produced(1.0, now_s=10.0)
    assert clock.runs_out_s == 11.0
    clock.resumed(now_s=12.5)  # 1.5 s of silence: it plays the next audio as it comes
    assert clock.runs_out_s == 12.5 and clock.lead_s(12.5) == 0.0
    clock.produced(0.5, now_s=12.5)
    assert clock.lead_s(12.6) == pytest.approx(0.4)
    fresh = PlaybackClock()
    fresh.resumed(now_s=3.0)  # no audio yet: nothing to resume
    assert fresh.runs_out_s is None


def test_a_first_window_covers_making_the_rest_and_the_other_streams_pieces() -> None:
    # Alone and silent: the window covers making the piece (0.3 s of compute).
    assert first_window_s(lead_s=0.0, make_s=0.3, others=0, workers=2) == pytest.approx(0.3)
    # Audio enough queued already: made whole.
    assert first_window_s(lead_s=2.0, make_s=0.3, others=0, workers=2) == 0.0
    # Seven other streams on two workers may each need one of their pieces (a share of 0.3 s,
    # less than a whole one) first: 0.3 + 7 * share * 0.3 / 2.
    assert 0 < OTHER_PIECE_SHARE < 1
    expected_s = 0.3 + 7 * OTHER_PIECE_SHARE * 0.3 / 2
    assert first_window_s(lead_s=0.0, make_s=0.3, others=7, workers=2) == pytest.approx(expected_s)
    assert first_window_s(lead_s=0.5, make_s=0.3, others=7, workers=2) == pytest.approx(
        expected_s - 0.5
    )


def test_a_rest_is_late_when_its_compute_and_the_margin_outlast_the_listener() -> None:
    assert not rest_is_late(time_left_s=1.0, make_s=0.3)
    assert rest_is_late(time_left_s=0.3 + LATE_MARGIN_S / 2, make_s=0.3)  # within the margin
    assert rest_is_late(time_left_s=-0.2, make_s=0.3)  # the listener has run out already
    assert not rest_is_late(time_left_s=0.3 + 2 * LATE_MARGIN_S, make_s=0.3)
