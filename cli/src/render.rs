//! A [`RingStatus`] as JSON and as text.

use serde_json::{json, Map, Value};
use vramring::inspect::{RingDetail, RingStatus, SubscriberRow};

/// Milliseconds from `then_ns` to `now_ns` (`CLOCK_MONOTONIC`), `None`
/// when `then_ns` is 0 (never).
pub fn age_ms(now_ns: u64, then_ns: u64) -> Option<f64> {
    (then_ns != 0).then(|| now_ns.saturating_sub(then_ns) as f64 / 1e6)
}

/// Rounds to one decimal for display in JSON.
pub fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// The epoch as printed: 16 hex digits.
pub fn epoch_hex(epoch: u64) -> String {
    format!("{epoch:016x}")
}

/// `1920x1080 nv12`-style summary fields shared by `ls`, `top` and
/// `inspect`.
pub fn summary_json(st: &RingStatus) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("path".into(), json!(st.path.display().to_string()));
    m.insert("status".into(), json!("ok"));
    m.insert("kind".into(), json!(st.kind().name()));
    m.insert("state".into(), json!(st.producer.state.name()));
    m.insert("epoch".into(), json!(epoch_hex(st.epoch)));
    m.insert("published".into(), json!(st.producer.published));
    m.insert("newest_seq".into(), json!(st.newest_seq()));
    m.insert("subscribers".into(), json!(st.subscriber_count()));
    m.insert("rate_hz".into(), json!(st.recent_rate_hz().map(round1)));
    m.insert(
        "last_commit_age_ms".into(),
        json!(st.newest_commit_ns().and_then(|t| age_ms(st.sampled_ns, t)).map(round1)),
    );
    match &st.detail {
        RingDetail::Frames(f) => {
            let g = &f.info.geometry();
            m.insert("format".into(), json!(g.format.name()));
            m.insert("width".into(), json!(g.width));
            m.insert("height".into(), json!(g.height));
            m.insert("slots".into(), json!(f.info.slot_count()));
            m.insert("backend".into(), json!(f.backend_name()));
            m.insert("gpu_uuid".into(), json!(f.gpu_uuid()));
            m.insert("policy".into(), json!(f.policy_name()));
        }
        RingDetail::Packets(p) => {
            m.insert("codec".into(), json!(p.codec_name()));
            m.insert("records".into(), json!(p.info.record_count));
            m.insert("data_bytes".into(), json!(p.info.data_bytes));
            m.insert("backend".into(), json!("host"));
            m.insert("keyframe_seq".into(), json!(p.keyframe_seq));
        }
    }
    m
}

/// One subscriber-table row as JSON.
pub fn row_json(st: &RingStatus, r: &SubscriberRow) -> Value {
    json!({
        "index": r.index,
        "name": r.name,
        "state": r.state.name(),
        "generation": r.generation,
        "mode": r.mode_name(),
        "delivery": r.delivery_name(),
        "lossless": r.lossless(),
        "sequential": r.sequential(),
        "push": r.push(),
        "push_active": r.push_buffers != 0,
        "write": r.write(),
        "delivered": r.delivered,
        "dropped": r.dropped,
        "overruns": r.overruns,
        "cursor": r.lossless().then_some(r.released_seq),
        "lag": r.lag(st.newest_seq()),
        "heartbeat_age_ms": age_ms(st.sampled_ns, r.heartbeat_ns).map(round1),
        "self": r.is_self,
    })
}

/// Everything `inspect --json` prints.
pub fn full_json(st: &RingStatus) -> Value {
    let mut m = summary_json(st);
    m.insert("layout_version".into(), json!(st.layout_version));
    m.insert("protocol_version".into(), json!(st.protocol_version));
    let p = &st.producer;
    m.insert(
        "producer".into(),
        json!({
            "state": p.state.name(),
            "heartbeat_age_ms": age_ms(st.sampled_ns, p.heartbeat_ns).map(round1),
            "published": p.published,
            "evictions": p.evictions,
            "connects": p.connects,
            "disconnects": p.disconnects,
        }),
    );
    m.insert("max_subscribers".into(), json!(st.max_subscribers));
    m.insert(
        "subscriber_table".into(),
        Value::Array(st.subscribers.iter().map(|r| row_json(st, r)).collect()),
    );
    match &st.detail {
        RingDetail::Frames(f) => {
            let g = &f.info.geometry();
            let planes: Vec<Value> = g.planes[..g.plane_count]
                .iter()
                .map(|p| json!({"offset": p.offset, "pitch": p.pitch, "rows": p.rows, "row_bytes": p.row_bytes}))
                .collect();
            m.insert("planes".into(), Value::Array(planes));
            m.insert("frame_bytes".into(), json!(g.frame_bytes));
            m.insert("slot_stride".into(), json!(g.slot_stride));
            m.insert("pool_bytes".into(), json!(f.info.pool_bytes()));
            m.insert("gate_offset".into(), json!(f.info.gate_offset()));
            m.insert("control_bytes".into(), json!(f.info.control_bytes()));
            m.insert("created_realtime_ns".into(), json!(f.created_realtime_ns));
            m.insert("global_seq".into(), json!(f.global_seq));
            let slots: Vec<Value> = f
                .slots
                .iter()
                .map(|s| {
                    json!({"index": s.index, "seq": s.seq, "writing": s.writing, "pts": s.pts,
                           "flags": s.flags, "age_ms": age_ms(st.sampled_ns, s.commit_ns).map(round1)})
                })
                .collect();
            m.insert("slot_table".into(), Value::Array(slots));
        }
        RingDetail::Packets(p) => {
            m.insert("codec_fourcc".into(), json!(p.info.codec));
            m.insert("max_packet".into(), json!(p.info.max_packet));
            m.insert("region_bytes".into(), json!(p.info.region_bytes));
            m.insert("write_seq".into(), json!(p.write_seq));
            m.insert("tail".into(), json!(p.tail));
            m.insert("head".into(), json!(p.head));
            m.insert("params_version".into(), json!(p.params_version));
            m.insert("params_bytes".into(), json!(p.params.len()));
            m.insert("params_hex".into(), json!(hex(&p.params)));
            let recs: Vec<Value> = p
                .records
                .iter()
                .map(|r| {
                    json!({"seq": r.seq, "offset": r.offset, "len": r.len, "key": r.is_key(), "flags": r.flags,
                           "pts": r.pts, "dts": r.dts, "codec": r.codec,
                           "age_ms": age_ms(st.sampled_ns, r.commit_ns).map(round1)})
                })
                .collect();
            m.insert("recent_records".into(), Value::Array(recs));
        }
    }
    Value::Object(m)
}

/// Lowercase hex of `b`.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `12.3 MiB`-style size.
pub fn bytes(n: u64) -> String {
    const U: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < U.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

/// A rate for a table cell.
pub fn rate(r: Option<f64>) -> String {
    r.map_or_else(|| "-".into(), |r| format!("{r:.1}"))
}

/// An optional number for a table cell.
pub fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

/// A subscriber's delivery rate, per second, when known.
pub type RateOf<'a> = &'a dyn Fn(&SubscriberRow) -> Option<f64>;

/// The subscriber table as aligned text rows (a header first).
pub fn table_text(st: &RingStatus, rates: Option<RateOf<'_>>) -> Vec<String> {
    let mut out = Vec::new();
    let with_rate = rates.is_some();
    let mut head = format!("{:>4}  {:<24} {:<8} {:<15}", "#", "NAME", "STATE", "MODE");
    if with_rate {
        head += &format!(" {:>8}", "RATE");
    }
    head += &format!(
        " {:>10} {:>8} {:>8} {:>8} {:>9}",
        "DELIVERED", "DROPPED", "OVERRUNS", "LAG", "LAST(ms)"
    );
    out.push(head);
    for r in &st.subscribers {
        let name = if r.is_self {
            format!("{} (this)", r.name)
        } else {
            r.name.clone()
        };
        // The read mode and the delivery granted (JSON also says whether
        // the push buffers are mapped yet).
        let mode = format!("{}/{}", r.mode_name(), r.delivery_name());
        let mut line = format!("{:>4}  {:<24} {:<8} {:<15}", r.index, name, r.state.name(), mode);
        if let Some(f) = rates {
            line += &format!(" {:>8}", rate(f(r)));
        }
        let last = age_ms(st.sampled_ns, r.heartbeat_ns).map_or_else(|| "-".into(), |a| format!("{a:.0}"));
        line += &format!(
            " {:>10} {:>8} {:>8} {:>8} {:>9}",
            r.delivered,
            r.dropped,
            r.overruns,
            opt(r.lag(st.newest_seq())),
            last
        );
        out.push(line);
    }
    out
}

/// `inspect`'s text output.
pub fn full_text(st: &RingStatus) -> Vec<String> {
    let mut o = Vec::new();
    let p = &st.producer;
    o.push(format!("ring       {}", st.path.display()));
    o.push(format!(
        "kind       {} (layout v{}, protocol v{})",
        st.kind().name(),
        st.layout_version,
        st.protocol_version
    ));
    o.push(format!("epoch      {}", epoch_hex(st.epoch)));
    let hb = age_ms(st.sampled_ns, p.heartbeat_ns).map_or_else(|| "never".into(), |a| format!("{a:.0} ms ago"));
    o.push(format!("publisher  {} (heartbeat {hb})", p.state.name()));
    o.push(format!(
        "counters   published {}, connects {}, disconnects {}, evictions {}",
        p.published, p.connects, p.disconnects, p.evictions
    ));
    o.push(format!("rate       {} Hz over the ring", rate(st.recent_rate_hz())));
    match &st.detail {
        RingDetail::Frames(f) => {
            let g = &f.info.geometry();
            o.push(format!(
                "format     {} {}x{}, {} bytes a frame, slot stride {}",
                g.format.name(),
                g.width,
                g.height,
                g.frame_bytes,
                g.slot_stride
            ));
            for (k, pl) in g.planes[..g.plane_count].iter().enumerate() {
                o.push(format!(
                    "plane {k}    offset {}, pitch {}, {} rows of {} bytes",
                    pl.offset, pl.pitch, pl.rows, pl.row_bytes
                ));
            }
            o.push(format!(
                "backend    {}{}, pool {}{}",
                f.backend_name(),
                f.gpu_uuid().map(|u| format!(" {u}")).unwrap_or_default(),
                bytes(f.info.pool_bytes()),
                f.info
                    .gate_offset()
                    .map(|g| format!(", gate word at {g}"))
                    .unwrap_or_default()
            ));
            o.push(format!("policy     {}", f.policy_name()));
            o.push(format!("global_seq {}", f.global_seq));
            let seqs: Vec<String> = f
                .slots
                .iter()
                .map(|s| {
                    if s.writing {
                        format!("{}*", s.seq)
                    } else {
                        s.seq.to_string()
                    }
                })
                .collect();
            o.push(format!(
                "slots      {}: [{}]  (* being written)",
                f.slots.len(),
                seqs.join(" ")
            ));
        }
        RingDetail::Packets(pk) => {
            o.push(format!(
                "codec      {} (params v{}, {} bytes: {})",
                pk.codec_name(),
                pk.params_version,
                pk.params.len(),
                if pk.params.len() > 48 {
                    format!("{}…", hex(&pk.params[..48]))
                } else {
                    hex(&pk.params)
                }
            ));
            o.push(format!(
                "ring       {} data, {} records, packets up to {}",
                bytes(pk.info.data_bytes),
                pk.info.record_count,
                bytes(u64::from(pk.info.max_packet))
            ));
            o.push(format!(
                "positions  write_seq {}, keyframe_seq {}, tail {}, head {}",
                pk.write_seq, pk.keyframe_seq, pk.tail, pk.head
            ));
            let recent: Vec<String> = pk
                .records
                .iter()
                .rev()
                .take(8)
                .map(|r| format!("{}{}:{}", r.seq, if r.is_key() { "K" } else { "" }, r.len))
                .collect();
            o.push(format!("recent     {} (seq[K]:bytes, newest first)", recent.join(" ")));
        }
    }
    o.push(format!(
        "subscribers {} of {} entries used ({} besides this one)",
        st.subscribers.len(),
        st.max_subscribers,
        st.subscriber_count()
    ));
    o.extend(table_text(st, None));
    o
}
