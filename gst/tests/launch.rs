//! The plugin as a user loads it: `libgstvramring.so` on `GST_PLUGIN_PATH`,
//! driven by `gst-launch-1.0` with the pipelines of the README, and
//! documented by `gst-inspect-1.0`.

mod common;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use gst::prelude::*;

/// A GStreamer tool with only our plugin directory added and a registry of
/// its own (no stale cache from another build).
fn tool(name: &str, plugins: &Path, registry: &Path) -> Command {
    let mut c = Command::new(name);
    c.env("GST_PLUGIN_PATH", plugins)
        .env("GST_REGISTRY", registry)
        .env_remove("GST_PLUGIN_PATH_1_0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Waits for `child` within `limit`; kills it and fails past that.
fn finish(mut child: Child, what: &str, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait().expect("the child's status") {
            Some(_) => return child.wait_with_output().expect("the child's output"),
            None if Instant::now() >= deadline => {
                let _ = child.kill();
                let out = child.wait_with_output().expect("the child's output");
                panic!(
                    "{what} did not finish within {limit:?}\nstdout:\n{}\nstderr:\n{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// `gst-inspect-1.0 arg` with `tool`'s environment; fails the test unless it
/// succeeds within `WAIT`. Returns its output.
fn gst_inspect(plugins: &Path, registry: &Path, arg: &str) -> String {
    let out = finish(
        tool("gst-inspect-1.0", plugins, registry)
            .arg(arg)
            .spawn()
            .expect("gst-inspect-1.0 runs"),
        "gst-inspect-1.0",
        WAIT,
    );
    assert!(out.status.success(), "gst-inspect-1.0 {arg} failed:\n{}", text(&out));
    text(&out)
}

/// The `gst-launch-1.0` command lines of the README's GStreamer section
/// that start with `needle`, as arguments, with `/tmp/cam0.sock` replaced.
fn readme_pipeline(needle: &str, socket: &Path) -> Vec<String> {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md")).expect("README.md");
    let line = readme
        .lines()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("README.md has no line with {needle:?}"));
    let args: Vec<String> = line
        .split_whitespace()
        .skip_while(|w| *w != "gst-launch-1.0")
        .skip(1)
        .map(|w| w.replace("/tmp/cam0.sock", &socket.display().to_string()))
        .collect();
    assert!(!args.is_empty(), "README line {line:?} has no pipeline");
    args
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn the_readme_gst_launch_pipelines_run() {
    let plugins = plugin_dir();
    let (dir, socket) = socket("cam0");
    let registry = dir.path().join("registry.bin");
    // A lease that a reader left unscheduled for a second on a busy machine
    // cannot run out (the README's line keeps the default).
    let mut publish = readme_pipeline("gst-launch-1.0 videotestsrc", &socket);
    assert!(publish.iter().any(|a| a == "policy=lossless"), "{publish:?}");
    publish.push("lossless-lease=60000".into());
    let read = readme_pipeline("gst-launch-1.0 vramringsrc", &socket);
    // One registry scan before the two pipelines, not two at once.
    gst_inspect(plugins.path(), &registry, "vramring");

    let mut sink = tool("gst-launch-1.0", plugins.path(), &registry)
        .args(&publish)
        .spawn()
        .expect("gst-launch-1.0 runs");
    // The reader starts once the publisher's socket exists: its `timeout`
    // then bounds only the wait after the publisher ends, as the README's
    // user sees it. A publisher that ends first, or makes no socket in
    // time, fails the test with its output (and is not left running).
    let deadline = Instant::now() + WAIT;
    while !socket.exists() {
        let ended = sink.try_wait().expect("the child's status").is_some();
        if ended || Instant::now() >= deadline {
            let _ = sink.kill();
            let out = sink.wait_with_output().expect("the child's output");
            panic!(
                "the publishing pipeline made no socket ({}):\n{}",
                if ended { "it ended" } else { "timed out" },
                text(&out)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let src = tool("gst-launch-1.0", plugins.path(), &registry)
        .args(&read)
        .spawn()
        .expect("gst-launch-1.0 runs");
    let sink = finish(sink, "the publishing gst-launch-1.0", WAIT * 2);
    let src = finish(src, "the reading gst-launch-1.0", WAIT * 2);
    assert!(sink.status.success(), "publishing pipeline failed:\n{}", text(&sink));
    assert!(src.status.success(), "reading pipeline failed:\n{}", text(&src));
    assert!(
        text(&src).contains("EOS"),
        "the reader ends at end of stream:\n{}",
        text(&src)
    );
}

#[test]
fn gst_inspect_documents_every_element_and_property() {
    init();
    let plugins = plugin_dir();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let registry = dir.path().join("registry.bin");
    let run = |arg: &str| gst_inspect(plugins.path(), &registry, arg);
    let plugin = run("vramring");
    let elements = ["vramringsink", "vramringsrc", "vramringpacketsink", "vramringpacketsrc"];
    for e in elements {
        assert!(plugin.contains(e), "gst-inspect-1.0 vramring lists {e}:\n{plugin}");
    }
    for e in elements {
        let page = run(e);
        let factory = gst::ElementFactory::find(e).expect("registered in this process too");
        for key in [
            gst::ELEMENT_METADATA_LONGNAME,
            gst::ELEMENT_METADATA_KLASS,
            gst::ELEMENT_METADATA_AUTHOR,
            gst::ELEMENT_METADATA_DESCRIPTION,
        ] {
            let value = factory.metadata(key).unwrap_or_else(|| panic!("{e} has no {key}"));
            assert!(
                !value.is_empty() && page.contains(value),
                "{e}'s {key} {value:?} is in gst-inspect-1.0's page"
            );
        }
        let element = factory.create().build().expect("the element");
        let own = element.list_properties();
        let parent = element.type_().parent().expect("a parent type");
        let inherited = gst::glib::object::ObjectClass::from_type(parent).expect("the parent class");
        for p in own.iter().filter(|p| inherited.find_property(p.name()).is_none()) {
            let blurb = p.blurb().unwrap_or_default();
            assert!(!blurb.is_empty(), "{e}.{} has a description", p.name());
            assert!(page.contains(p.name()), "gst-inspect-1.0 {e} lists {}", p.name());
            assert!(
                page.contains(&blurb[..blurb.len().min(40)]),
                "gst-inspect-1.0 {e} describes {}",
                p.name()
            );
        }
    }
}
