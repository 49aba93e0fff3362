//! The serving settings both sinks share (`vramring::ServeConfig`: who may
//! connect, how many, the handshake and lossless lease, the push attach
//! rate), as GObject properties, and the publishers' counters as a
//! `GstStructure`.

use std::time::Duration;

use gst::glib;
use gst::prelude::*;
use vramring::{AttachRate, PublisherStats, ServeConfig};

/// The property names this module handles.
const NAMES: [&str; 10] = [
    "socket-mode",
    "max-subscribers",
    "max-pending",
    "max-per-uid",
    "allow-uids",
    "allow-gids",
    "handshake-timeout",
    "lossless-lease",
    "attach-rate",
    "attach-burst",
];

/// The properties, in the order `gst-inspect-1.0` lists them.
pub fn properties() -> Vec<glib::ParamSpec> {
    let d = ServeConfig::default();
    let rate = d.attach_rate.unwrap_or(AttachRate::DEFAULT);
    vec![
        glib::ParamSpecUInt::builder("socket-mode")
            .nick("Socket mode")
            .blurb("Permission bits of the socket file (octal 0660 = 432): who may connect at all")
            .maximum(0o7777)
            .default_value(d.socket_mode)
            .mutable_ready()
            .build(),
        glib::ParamSpecUInt::builder("max-subscribers")
            .nick("Max subscribers")
            .blurb("Subscribers served at once; later ones are refused")
            .minimum(1)
            .default_value(d.max_subscribers)
            .mutable_ready()
            .build(),
        glib::ParamSpecUInt::builder("max-pending")
            .nick("Max pending handshakes")
            .blurb("Connections in their handshake at once")
            .minimum(1)
            .default_value(d.max_pending)
            .mutable_ready()
            .build(),
        glib::ParamSpecUInt::builder("max-per-uid")
            .nick("Max subscribers per uid")
            .blurb("Subscribers one uid (SO_PEERCRED) may hold at once (0: no limit beyond max-subscribers)")
            .default_value(0)
            .mutable_ready()
            .build(),
        glib::ParamSpecString::builder("allow-uids")
            .nick("Allowed uids")
            .blurb("Comma-separated uids allowed to subscribe, checked against SO_PEERCRED besides the socket mode (empty: anyone the mode admits)")
            .mutable_ready()
            .build(),
        glib::ParamSpecString::builder("allow-gids")
            .nick("Allowed gids")
            .blurb("Comma-separated gids allowed to subscribe (empty: anyone the mode admits)")
            .mutable_ready()
            .build(),
        glib::ParamSpecUInt64::builder("handshake-timeout")
            .nick("Handshake timeout")
            .blurb("Milliseconds a connecting subscriber has to finish its handshake")
            .minimum(1)
            .default_value(d.handshake_timeout.as_millis() as u64)
            .mutable_ready()
            .build(),
        glib::ParamSpecUInt64::builder("lossless-lease")
            .nick("Lossless lease")
            .blurb("Milliseconds a lossless subscriber may hold up the publisher before it is evicted")
            .minimum(1)
            .default_value(d.lossless_lease.as_millis() as u64)
            .mutable_ready()
            .build(),
        glib::ParamSpecUInt::builder("attach-rate")
            .nick("Attach rate")
            .blurb("Push attaches served per second after the burst (0: every attach at once, for trusted subscribers only)")
            .default_value(rate.per_second)
            .mutable_ready()
            .build(),
        glib::ParamSpecUInt::builder("attach-burst")
            .nick("Attach burst")
            .blurb("Push attaches served at once before attach-rate applies")
            .minimum(1)
            .default_value(rate.burst)
            .mutable_ready()
            .build(),
    ]
}

/// Parses a comma-separated id list; `None` names the first bad entry.
pub fn parse_ids(s: &str) -> Result<Vec<u32>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| t.parse::<u32>().map_err(|_| format!("{t:?} is not a numeric id")))
        .collect()
}

fn join_ids(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// The serving settings, as the properties set them.
#[derive(Debug, Clone)]
pub struct ServeSettings {
    pub config: ServeConfig,
    attach_burst: u32,
}

impl Default for ServeSettings {
    fn default() -> Self {
        let config = ServeConfig::default();
        let attach_burst = config.attach_rate.unwrap_or(AttachRate::DEFAULT).burst;
        ServeSettings { config, attach_burst }
    }
}

impl ServeSettings {
    /// Whether `name` is one of this module's properties.
    pub fn handles(name: &str) -> bool {
        NAMES.contains(&name)
    }

    /// Sets property `name`. A bad id list is logged and leaves the
    /// setting as it was.
    pub fn set(&mut self, name: &str, value: &glib::Value, cat: gst::DebugCategory) {
        let c = &mut self.config;
        match name {
            "socket-mode" => c.socket_mode = value.get().unwrap_or(c.socket_mode),
            "max-subscribers" => c.max_subscribers = value.get().unwrap_or(c.max_subscribers),
            "max-pending" => c.max_pending = value.get().unwrap_or(c.max_pending),
            "max-per-uid" => c.max_per_uid = value.get::<u32>().ok().filter(|&n| n > 0),
            "allow-uids" | "allow-gids" => {
                let s = value.get::<Option<String>>().ok().flatten().unwrap_or_default();
                match parse_ids(&s) {
                    Ok(ids) if name == "allow-uids" => c.access.uids = ids,
                    Ok(ids) => c.access.gids = ids,
                    Err(e) => gst::warning!(cat, "{name}: {e}; the setting is unchanged"),
                }
            }
            "handshake-timeout" => {
                c.handshake_timeout = Duration::from_millis(value.get().unwrap_or(2000));
            }
            "lossless-lease" => c.lossless_lease = Duration::from_millis(value.get().unwrap_or(1000)),
            "attach-rate" => {
                let per_second: u32 = value.get().unwrap_or(0);
                c.attach_rate = (per_second > 0).then_some(AttachRate {
                    per_second,
                    burst: self.attach_burst,
                });
            }
            "attach-burst" => {
                self.attach_burst = value.get().unwrap_or(self.attach_burst);
                if let Some(rate) = c.attach_rate.as_mut() {
                    rate.burst = self.attach_burst;
                }
            }
            _ => {}
        }
    }

    /// The value of property `name`.
    pub fn get(&self, name: &str) -> glib::Value {
        let c = &self.config;
        match name {
            "socket-mode" => c.socket_mode.to_value(),
            "max-subscribers" => c.max_subscribers.to_value(),
            "max-pending" => c.max_pending.to_value(),
            "max-per-uid" => c.max_per_uid.unwrap_or(0).to_value(),
            "allow-uids" => join_ids(&c.access.uids).to_value(),
            "allow-gids" => join_ids(&c.access.gids).to_value(),
            "handshake-timeout" => (c.handshake_timeout.as_millis() as u64).to_value(),
            "lossless-lease" => (c.lossless_lease.as_millis() as u64).to_value(),
            "attach-rate" => c.attach_rate.map_or(0, |r| r.per_second).to_value(),
            "attach-burst" => self.attach_burst.to_value(),
            _ => glib::Value::from_type(glib::Type::INVALID),
        }
    }
}

/// A publisher's counters as the sinks' `stats` property shows them.
pub fn stats_structure(s: Option<PublisherStats>) -> gst::Structure {
    let s = s.unwrap_or_default();
    gst::Structure::builder("vramring-publisher-stats")
        .field("published", s.published)
        .field("subscribers", s.subscribers)
        .field("connects", s.connects)
        .field("disconnects", s.disconnects)
        .field("evictions", s.evictions)
        .field("refused", s.refused)
        .field("lossless-waits", s.lossless_waits)
        .field("attaches", s.attaches)
        .field("attaches-deferred", s.attaches_deferred)
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_lists_parse_and_name_a_bad_entry() {
        assert_eq!(parse_ids(""), Ok(vec![]));
        assert_eq!(parse_ids("1000, 1001,"), Ok(vec![1000, 1001]));
        assert!(parse_ids("1000,bob").unwrap_err().contains("bob"));
    }

    #[test]
    fn every_property_reads_back_its_default() {
        gst::init().unwrap();
        let s = ServeSettings::default();
        for p in properties() {
            assert!(ServeSettings::handles(p.name()), "{}", p.name());
            let v = s.get(p.name());
            assert_eq!(v.type_(), p.value_type(), "{}", p.name());
        }
        assert_eq!(properties().len(), NAMES.len());
    }
}
