//! Results: the Markdown report and its JSON lines, and the command line
//! they come from.

use std::path::Path;

use crate::R;

/// The bench's arguments: the program name and the `--bench` that `cargo
/// bench` appends left out.
pub fn args() -> Vec<String> {
    std::env::args().skip(1).filter(|a| a != "--bench").collect()
}

/// The value after `flag` in `args`, if both are there.
pub fn value_of<'a>(args: &'a [String], flag: &str) -> Option<&'a String> {
    args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1))
}

/// Whether `args` holds `flag`.
pub fn has(args: &[String], flag: &str) -> bool {
    args.iter().any(|a| a == flag)
}

/// Prints `usage` when `args` asks for help (`-h`, `--help`); then the
/// bench has nothing more to do.
pub fn help(args: &[String], usage: &str) -> bool {
    let asked = has(args, "-h") || has(args, "--help");
    if asked {
        println!("{usage}");
    }
    asked
}

/// The exit of a bench's `main`: success, or the error on stderr (after
/// `prefix`, when not empty) and exit code `code`.
pub fn exit(result: R<()>, prefix: &str, code: u8) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // A sentence, not a Debug dump.
            eprintln!("{prefix}{e}");
            std::process::ExitCode::from(code)
        }
    }
}

/// The one of `all` whose `key` is `k` (a row, mode or system named on
/// the command line).
pub fn by_key<T: Copy>(all: &[T], key: impl Fn(T) -> &'static str, k: &str) -> Option<T> {
    all.iter().copied().find(|&t| key(t) == k)
}

/// A JSON number with three decimals, or `null` for NaN and infinities (a
/// figure without samples).
pub fn json_num(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.3}")
    } else {
        "null".into()
    }
}

/// A Markdown table's header for `columns` ("a | b"): `| a | b |` and its
/// `|---|---|` line.
pub fn table_header(columns: &str) -> String {
    format!("| {columns} |\n|{}\n", "---|".repeat(columns.split(" | ").count()))
}

/// Writes the report `md` to `path` and its JSON lines `jsonl` beside it,
/// with the extension `.jsonl`.
pub fn write_report(path: &Path, md: &str, jsonl: &str) -> R<()> {
    std::fs::write(path, md)?;
    std::fs::write(path.with_extension("jsonl"), jsonl)?;
    Ok(())
}

/// Writes `<name>.md` and `<name>.jsonl` into `dir` (made if missing).
pub fn write_report_in(dir: &Path, name: &str, md: &str, jsonl: &str) -> R<()> {
    std::fs::create_dir_all(dir)?;
    write_report(&dir.join(format!("{name}.md")), md, jsonl)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_numbers_and_flags() {
        assert_eq!(table_header("a | b c"), "| a | b c |\n|---|---|\n");
        assert_eq!(json_num(1.23456), "1.235");
        assert_eq!(json_num(f64::NAN), "null");
        let args: Vec<String> = ["--x", "1", "--y"].map(String::from).to_vec();
        assert_eq!(value_of(&args, "--x").map(String::as_str), Some("1"));
        assert_eq!(value_of(&args, "--y"), None);
        assert!(has(&args, "--y") && !help(&args, ""));
        assert_eq!(by_key(&[1u8, 2], |x| ["a", "b", "c"][x as usize], "c"), Some(2));
        assert_eq!(by_key(&[1u8, 2], |x| ["a", "b", "c"][x as usize], "a"), None);
    }

    #[test]
    fn a_report_and_its_json_lines_go_side_by_side() {
        let dir = std::env::temp_dir().join(format!("vramring-benches-out-{}", std::process::id()));
        write_report_in(&dir, "x", "# md\n", "{}\n").unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("x.md")).unwrap(), "# md\n");
        assert_eq!(std::fs::read_to_string(dir.join("x.jsonl")).unwrap(), "{}\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
