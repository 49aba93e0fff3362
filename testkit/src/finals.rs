//! The final JSON line of a finished example process (the tests that run
//! the examples as producers and subscribers).

use std::process::Child;

use crate::json::JsonLine;

/// Waits for `child` (`name` in messages), asserts that it exited 0, and
/// returns its final JSON line.
pub fn final_line(name: &str, child: Child) -> JsonLine {
    let out = child.wait_with_output().expect("waiting for a child process");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{name} failed: {text}");
    let j = JsonLine::final_in(&text);
    eprintln!("{name}: {j:?}");
    j
}

/// [`final_line`] of a consumer, after asserting that it saw 0 torn frames.
pub fn untorn_final(name: &str, child: Child) -> JsonLine {
    let j = final_line(name, child);
    assert_eq!(j.u64("torn"), Some(0), "{name}: {j:?}");
    j
}
