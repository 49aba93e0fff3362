//! Times between an element's clock and `CLOCK_MONOTONIC`, the clock every
//! process on the host shares (vramring stamps commits with it:
//! [`vramring::monotonic_ns`]).
//!
//! A frame's presentation time crosses the ring as `CLOCK_MONOTONIC`
//! nanoseconds: the sink turns the running time it would render at into
//! its clock's time (+ base time) and that into monotonic time; the source
//! turns it back into its own clock and subtracts its base time, so the
//! buffer lands at the same instant on the source's running-time axis.
//! When the element's clock is GStreamer's system clock on
//! `CLOCK_MONOTONIC` (the default pipeline clock), the two are the same
//! clock and no conversion is made; otherwise the offset between them is
//! sampled at the call.

use gst::prelude::*;

/// Whether `clock` reads `CLOCK_MONOTONIC` itself: GStreamer's system clock
/// of type monotonic, not slaved to a master.
fn is_monotonic_system_clock(clock: &gst::Clock) -> bool {
    let Some(system) = clock.downcast_ref::<gst::SystemClock>() else {
        return false;
    };
    system.property::<gst::ClockType>("clock-type") == gst::ClockType::Monotonic && clock.master().is_none()
}

/// `clock`'s time `t` as `CLOCK_MONOTONIC` ns.
pub fn clock_to_monotonic(clock: &gst::Clock, t: gst::ClockTime) -> Option<u64> {
    if is_monotonic_system_clock(clock) {
        return Some(t.nseconds());
    }
    let now_clock = clock.time().nseconds() as i128;
    let now_mono = vramring::monotonic_ns() as i128;
    u64::try_from(t.nseconds() as i128 - now_clock + now_mono).ok()
}

/// `CLOCK_MONOTONIC` ns `mono` as `clock`'s time.
pub fn monotonic_to_clock(clock: &gst::Clock, mono: u64) -> Option<gst::ClockTime> {
    if is_monotonic_system_clock(clock) {
        return Some(gst::ClockTime::from_nseconds(mono));
    }
    let now_clock = clock.time().nseconds() as i128;
    let now_mono = vramring::monotonic_ns() as i128;
    u64::try_from(mono as i128 - now_mono + now_clock)
        .ok()
        .map(gst::ClockTime::from_nseconds)
}

/// The running time of `element` at which a frame presented at
/// `CLOCK_MONOTONIC` ns `mono` falls: its clock's time minus its base time,
/// 0 for a frame from before the element's base time. `None` without a
/// clock.
pub fn monotonic_to_running_time(element: &gst::Element, mono: u64) -> Option<gst::ClockTime> {
    let clock = element.clock()?;
    let base = element.base_time()?;
    let t = monotonic_to_clock(&clock, mono)?;
    Some(t.saturating_sub(base))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_system_clock_is_monotonic_time_itself() {
        gst::init().unwrap();
        let clock = gst::SystemClock::obtain();
        let t = gst::ClockTime::from_seconds(5);
        assert!(
            is_monotonic_system_clock(&clock),
            "GStreamer's default clock reads CLOCK_MONOTONIC"
        );
        assert_eq!(clock_to_monotonic(&clock, t), Some(5_000_000_000));
        assert_eq!(monotonic_to_clock(&clock, 5_000_000_000), Some(t));
    }

    #[test]
    fn another_clock_round_trips_through_monotonic_time() {
        gst::init().unwrap();
        let clock = gst::glib::Object::builder::<gst::SystemClock>()
            .property("clock-type", gst::ClockType::Realtime)
            .build()
            .upcast::<gst::Clock>();
        assert!(!is_monotonic_system_clock(&clock));
        let mono = vramring::monotonic_ns();
        let on_clock = monotonic_to_clock(&clock, mono).unwrap();
        // The wall clock counts from 1970, the monotonic one from boot.
        assert!(on_clock.nseconds().abs_diff(mono) > 1_000_000_000);
        let back = clock_to_monotonic(&clock, on_clock).unwrap();
        // Two samples of the offset, taken moments apart, differ by the
        // time between them: far less than a second.
        assert!(back.abs_diff(mono) < 1_000_000_000, "{back} vs {mono}");
    }
}
