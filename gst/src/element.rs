//! What every element of the plugin declares the same way: its metadata,
//! its one always-present pad, its socket-path property, and how it locks
//! its settings and state.

use std::sync::{Mutex, MutexGuard, TryLockError};

use gst::glib;
use gst::prelude::*;

/// The element's metadata (long name, classification, description), with
/// the plugin's author.
pub(crate) fn metadata(long_name: &str, classification: &str, description: &str) -> gst::subclass::ElementMetadata {
    gst::subclass::ElementMetadata::new(long_name, classification, description, "vramring developers")
}

/// The element's one pad, always present: `name`, `direction`, `caps`.
pub(crate) fn one_pad(name: &str, direction: gst::PadDirection, caps: &gst::Caps) -> Vec<gst::PadTemplate> {
    vec![gst::PadTemplate::new(name, direction, gst::PadPresence::Always, caps).expect("a static pad template")]
}

/// The `socket-path` property: the ring's Unix socket, `default` until set,
/// settable in the READY state.
pub(crate) fn socket_path(blurb: &str, default: &str) -> glib::ParamSpec {
    glib::ParamSpecString::builder("socket-path")
        .nick("Socket path")
        .blurb(blurb)
        .default_value(Some(default))
        .mutable_ready()
        .build()
}

/// Locks `m`, whatever a panicking holder left in it (settings and state
/// stay usable; the element reports the panic itself).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `m` locked if nobody holds it now (as [`lock`] takes a poisoned one):
/// for a property read that must not wait behind the streaming thread,
/// which holds an element's state through its waits.
pub(crate) fn try_lock<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}
