//! The one-line JSON reports the examples and test roles print, and their
//! reading back.

use std::io::Write as _;

use serde_json::{Map, Value};

/// Builds one JSON object, its members in the order they are added.
#[derive(Debug, Default)]
pub struct Json(Vec<(String, Value)>);

impl Json {
    /// An object whose first member is `"event": event`.
    pub fn event(event: &str) -> Self {
        Json::default().str("event", event)
    }
    /// Adds a string member.
    pub fn str(mut self, k: &str, v: &str) -> Self {
        self.0.push((k.to_owned(), Value::from(v)));
        self
    }
    /// Adds an integer member.
    pub fn u64(mut self, k: &str, v: u64) -> Self {
        self.0.push((k.to_owned(), Value::from(v)));
        self
    }
    /// Adds a number member, to three decimals (NaN and infinities become 0).
    pub fn f64(mut self, k: &str, v: f64) -> Self {
        let v = if v.is_finite() {
            (v * 1000.0).round() / 1000.0
        } else {
            0.0
        };
        self.0.push((k.to_owned(), Value::from(v)));
        self
    }
    /// The object's text, on one line.
    pub fn finish(self) -> String {
        let members: Vec<String> = self
            .0
            .iter()
            .map(|(k, v)| format!("{}:{v}", Value::from(k.as_str())))
            .collect();
        format!("{{{}}}", members.join(","))
    }
}

/// Prints one line to stdout and flushes it (stdout may be a pipe).
pub fn emit(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// A JSON object's members (by name; the order is not kept), each value
/// as text: strings unescaped, numbers and booleans as written.
#[derive(Debug, Clone, Default)]
pub struct JsonLine(pub Vec<(String, String)>);

impl JsonLine {
    /// The last line of `output` that is a JSON object with
    /// `"event":"final"` (the summary every example prints at its end).
    ///
    /// # Panics
    /// When there is none, showing `output`.
    pub fn final_in(output: &str) -> JsonLine {
        output
            .lines()
            .rev()
            .filter_map(JsonLine::parse)
            .find(|j| j.get("event") == Some("final"))
            .unwrap_or_else(|| panic!("no final JSON line in:\n{output}"))
    }

    /// Parses one JSON object; `None` for anything else.
    pub fn parse(line: &str) -> Option<JsonLine> {
        let object: Map<String, Value> = serde_json::from_str(line.trim()).ok()?;
        let members = object
            .into_iter()
            .map(|(k, v)| {
                let text = match v {
                    Value::String(s) => s,
                    other => other.to_string(),
                };
                (k, text)
            })
            .collect();
        Some(JsonLine(members))
    }

    /// The member `k` as text.
    pub fn get(&self, k: &str) -> Option<&str> {
        self.0.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str())
    }

    /// The member `k` as an integer.
    pub fn u64(&self, k: &str) -> Option<u64> {
        self.get(k)?.parse().ok()
    }

    /// The member `k` as a number.
    pub fn f64(&self, k: &str) -> Option<f64> {
        self.get(k)?.parse().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::{Json, JsonLine};

    #[test]
    fn a_built_object_reads_back_member_for_member() {
        let line = Json::event("final")
            .str("name", "a \"quoted\"\nname")
            .u64("torn", 0)
            .f64("p50_us", 12.3456)
            .f64("bad", f64::NAN)
            .finish();
        assert!(line.starts_with("{\"event\":\"final\",\"name\""), "{line}");
        let j = JsonLine::parse(&line).unwrap();
        assert_eq!(j.get("name"), Some("a \"quoted\"\nname"));
        assert_eq!(j.u64("torn"), Some(0));
        assert_eq!(j.f64("p50_us"), Some(12.346));
        assert_eq!(j.f64("bad"), Some(0.0));
    }

    #[test]
    fn the_last_final_line_is_found_with_its_members_as_text() {
        let out = "noise\n{\"event\":\"final\",\"torn\":1}\n{\"event\":\"final\",\"torn\":0,\"p50_us\":1.5,\"name\":\"a\\\"b\"}\n{\"event\":\"tick\"}\n";
        let j = JsonLine::final_in(out);
        assert_eq!(j.u64("torn"), Some(0));
        assert_eq!(j.f64("p50_us"), Some(1.5));
        assert_eq!(j.get("name"), Some("a\"b"));
        assert!(JsonLine::parse("[1, 2]").is_none());
    }
}
