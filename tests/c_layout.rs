//! `proto/vramring.h` describes the same bytes as the Rust crate.
//!
//! The test generates a C program that includes the header and prints one
//! `label value` line per check (struct sizes and alignments, every field's
//! offset and size, constants, message records, and a decode of messages the
//! Rust encoder produced), compiles it with the system C compiler (`$CC`,
//! else `cc`), runs it, and compares every line with the value the Rust side
//! computes from `vramring::seam::layout`, `vramring::format`,
//! `vramring::seam::packet_layout` and `vramring::seam::socket::msg`. The C code in
//! `proto/PROTOCOL.md` is compiled too: its test-pattern functions are
//! checked against `vramring_testkit::pattern`, its push-delivery claim,
//! complete and take (section 16.5) against `vramring::seam::protocol::push`, and
//! its packet reader (section 17.12) is run on a packet ring the Rust writer
//! filled and checked against `vramring::packet::PacketReader`; its
//! Appendix B frame reader runs as a lossless subscriber of a real Rust
//! publisher (every frame intact, "producer gone" after the orderly close,
//! not "evicted"). A real host publisher's Welcomes are
//! checked too: descriptor counts, seals, read-only access modes and
//! `client_bytes` against the header, and a v1 Hello refused with
//! `VR_REJECT_VERSION`. Every version number PROTOCOL.md writes next to its
//! constant is the one the crate speaks. A missing C compiler is a failure,
//! never a skip.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use vramring::seam::layout;
use vramring::seam::packet_layout;
use vramring::seam::socket::msg;

/// One line the C program prints and the value Rust expects for it.
struct Check {
    label: String,
    c_expr: String,
    expected: u64,
}

#[derive(Default)]
struct Checks {
    list: Vec<Check>,
    /// Statements emitted into `main` before the checks (decode buffers).
    prelude: String,
    /// Top-level C code emitted before `main` (code taken from PROTOCOL.md).
    top: String,
}

impl Checks {
    fn push(&mut self, label: impl Into<String>, c_expr: impl Into<String>, expected: impl TryInto<u64>) {
        let label = label.into();
        let expected = expected
            .try_into()
            .unwrap_or_else(|_| panic!("{label}: expected value does not fit u64"));
        self.list.push(Check {
            label,
            c_expr: c_expr.into(),
            expected,
        });
    }

    /// A constant of the header: `label` is also the C expression.
    fn constant(&mut self, name: &str, expected: impl TryInto<u64>) {
        self.push(name, name, expected);
    }
}

/// The first fenced C block after the heading `heading` in PROTOCOL.md.
fn doc_c_block(md: &str, heading: &str) -> String {
    let at = md
        .find(heading)
        .unwrap_or_else(|| panic!("PROTOCOL.md has no heading {heading:?}"));
    let rest = &md[at..];
    let start = rest
        .find("```c\n")
        .unwrap_or_else(|| panic!("no C block after {heading:?}"))
        + 5;
    let len = rest[start..].find("\n```").expect("unterminated C block");
    rest[start..start + len].to_owned()
}

#[path = "c_layout/messages.rs"]
mod messages;
#[path = "c_layout/packet_reader.rs"]
mod packet_reader;
#[path = "c_layout/protocol_md.rs"]
mod protocol_md;
#[path = "c_layout/push_claims.rs"]
mod push_claims;
#[path = "c_layout/structs.rs"]
mod structs;

use messages::{live_welcome, messages};
use protocol_md::{appendix_b_runs_against_a_rust_publisher, protocol_md_code};
use structs::{constants, packet_layout, shared_layout};

fn c_program(c: &Checks) -> String {
    let mut s = String::new();
    // _GNU_SOURCE: Appendix B calls syscall(SYS_futex) and clock_gettime.
    s.push_str(
        "#define _GNU_SOURCE\n#include <errno.h>\n#include <stdio.h>\n#include <stddef.h>\n#include <stdlib.h>\n\
         #include <string.h>\n#include <sys/mman.h>\n#include <sys/socket.h>\n#include <time.h>\n#include \"vramring.h\"\n\n",
    );
    s.push_str(&c.top);
    s.push_str("int main(int argc, char **argv) {\n    if (argc == 12 && strcmp(argv[1], \"b\") == 0) return run_appendix_b(argv);\n");
    s.push_str(&c.prelude);
    for k in &c.list {
        let _ = writeln!(
            s,
            "    printf(\"%s %llu\\n\", \"{}\", (unsigned long long)({}));",
            k.label, k.c_expr
        );
    }
    s.push_str("    return 0;\n}\n");
    s
}

/// The C compiler: `$CC` (which may carry flags), else `cc`.
fn compiler() -> (String, Vec<String>) {
    let cc = std::env::var("CC")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| "cc".into());
    let mut words = cc.split_whitespace().map(str::to_owned);
    let prog = words.next().unwrap_or_else(|| "cc".into());
    (prog, words.collect())
}

fn compile_and_run(dir: &Path, source: &str) -> String {
    let src = dir.join("c_layout.c");
    let exe = dir.join("c_layout");
    std::fs::write(&src, source).expect("writing the C program");
    let proto = Path::new(env!("CARGO_MANIFEST_DIR")).join("proto");
    let (cc, cc_args) = compiler();
    let out = Command::new(&cc)
        .args(&cc_args)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-O0", "-I"])
        .arg(&proto)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "no C compiler: running `{cc}` failed ({e}). This test checks proto/vramring.h against the \
                 Rust layout and needs one: install gcc or clang, or set CC"
            )
        });
    assert!(
        out.status.success(),
        "`{cc}` could not compile a program including proto/vramring.h ({}):\n{}\n(program: {})",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        src.display()
    );
    let run = Command::new(&exe).output().expect("running the compiled C program");
    assert!(
        run.status.success(),
        "the C program failed ({}):\n{}{}",
        run.status,
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    String::from_utf8(run.stdout).expect("C program output is UTF-8")
}

fn scratch_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("c_layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("creating a scratch directory");
    dir
}

#[test]
fn c_header_matches_the_rust_layout_and_messages() {
    let mut checks = Checks::default();
    shared_layout(&mut checks);
    packet_layout(&mut checks);
    constants(&mut checks);
    messages(&mut checks);
    live_welcome(&mut checks);
    protocol_md_code(&mut checks);

    let dir = scratch_dir();
    let output = compile_and_run(&dir, &c_program(&checks));

    let mut got: BTreeMap<&str, &str> = BTreeMap::new();
    for line in output.lines() {
        let (label, value) = line.rsplit_once(' ').unwrap_or((line, ""));
        assert!(got.insert(label, value).is_none(), "duplicate label {label:?}");
    }
    let mut failures = Vec::new();
    for k in &checks.list {
        match got.remove(k.label.as_str()) {
            None => failures.push(format!("{}: missing from the C program's output", k.label)),
            Some(v) if v.parse::<u64>().ok() != Some(k.expected) => failures.push(format!(
                "{}: C says {v}, Rust says {}   [{}]",
                k.label, k.expected, k.c_expr
            )),
            Some(_) => {}
        }
    }
    for (label, v) in got {
        failures.push(format!("{label}: printed by the C program ({v}) but not checked"));
    }
    assert!(
        failures.is_empty(),
        "proto/vramring.h or proto/PROTOCOL.md disagrees with the Rust crate in {} of {} checks:\n  {}",
        failures.len(),
        checks.list.len(),
        failures.join("\n  ")
    );
    appendix_b_runs_against_a_rust_publisher(&dir.join("c_layout"), &dir);
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("{} layout, constant and message checks agree", checks.list.len());
}

/// Every place PROTOCOL.md writes a version number next to its constant,
/// as "`VR_LAYOUT_VERSION` (4)" or "**4** (`VR_LAYOUT_VERSION`)", names the
/// number this build speaks: a reader who takes the number from the text
/// must not be refused by the crate.
#[test]
fn protocol_md_names_the_version_numbers_this_build_speaks() {
    let md_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("proto/PROTOCOL.md");
    let md = std::fs::read_to_string(&md_path).expect("reading proto/PROTOCOL.md");
    // Line breaks as spaces (same offsets), for a phrase wrapped in the text.
    let flat = md.replace('\n', " ");
    let digits = |s: &str| s.chars().take_while(char::is_ascii_digit).collect::<String>();
    for (name, ours) in [
        ("VR_PROTOCOL_VERSION", msg::PROTOCOL_VERSION),
        ("VR_LAYOUT_VERSION", layout::LAYOUT_VERSION),
        ("VR_PACKET_LAYOUT_VERSION", packet_layout::PACKET_LAYOUT_VERSION),
    ] {
        let mut named = Vec::new();
        let after = format!("`{name}` (");
        for (at, _) in flat.match_indices(&after) {
            named.push((at, digits(&flat[at + after.len()..])));
        }
        let before = format!("** (`{name}`)");
        for (at, _) in flat.match_indices(&before) {
            let head = &flat[..at];
            let start = head.trim_end_matches(|c: char| c.is_ascii_digit()).len();
            named.push((at, head[start..].to_owned()));
        }
        assert!(!named.is_empty(), "PROTOCOL.md never names {name} with its number");
        for (at, n) in named {
            let line = md[..at].lines().count().max(1);
            assert_eq!(
                n,
                ours.to_string(),
                "PROTOCOL.md line {line} gives {name} as {n:?}; this build speaks {ours}"
            );
        }
    }
}
