//! Stream-order commits on the fake driver (no GPU needed): the commit
//! kernel copies the slot into every push target (more than one launch's
//! worth) and only then stores the push seqs, the slot seq and
//! `global_seq`; a failure at any driver call of registration, commit or
//! close surfaces and leaves nothing registered, loaded or allocated, every
//! release in the pool's context. Commits with push targets go through the
//! replayed graph and its descriptor ring (ADR 0021), round the ring and
//! back to a launch where an entry is not free; by default only while the
//! ring publishes fast, and never after a pause until its pace is fast
//! again (ADR 0022). The GPU proof is `tests/gpu_commit.rs`.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use vramring::seam::cuda::{CommitGraph, CuContext, CudaImport, CudaPool, DeviceSelector, Driver, MAX_FANOUT};
use vramring::seam::cuda::{ExportedPool, ImportedPool, PushWrite, StreamCommit};
use vramring::seam::cuda::{GateLine, StreamCommits};
use vramring::WriteCompletion;
use vramring_testkit::fake::{CallRecord, FakeDevice, FakeDriver};

use vramring_testkit::marks;

const GPU: [u8; 16] = *b"fake-gpu-0123456";
const MIB: u64 = 1 << 20;
/// More targets than one launch serves, so the commit takes two launches.
const TARGETS: usize = MAX_FANOUT + 2;
const STRIDE: u64 = 2 * MIB;
const FRAME: u64 = MIB;
/// Pool offset of the gate word (ADR 0011), past the frame.
const GATE: u64 = 4 * MIB;

fn publisher_process() -> Arc<FakeDriver> {
    FakeDriver::with_one_gpu(GPU)
}

fn subscriber_process() -> Arc<FakeDriver> {
    FakeDriver::new(vec![FakeDevice::discrete(GPU)])
}

fn foreign_current(d: &FakeDriver) -> CuContext {
    let f = d.foreign_context();
    d.set_current(Some(f));
    f
}

fn assert_clean(d: &FakeDriver, foreign: CuContext, what: &str) {
    assert!(d.leaks().is_empty(), "{what}: leaked {:?}", d.leaks());
    let wrong: Vec<CallRecord> = d
        .releases()
        .into_iter()
        .filter(|r| matches!(r.owner, Some(Some(owner)) if r.current != Some(owner)))
        .collect();
    assert!(
        wrong.is_empty(),
        "{what}: releases outside their owning context: {wrong:#?}"
    );
    assert_eq!(
        d.current(),
        Some(foreign),
        "{what}: the caller's context is not current again"
    );
}

/// Host memory standing in for the control region and the table: page
/// aligned, shared, holding the commit words.
struct Words {
    map: memmap2::MmapMut,
}

impl Words {
    fn new() -> Words {
        Words {
            map: memmap2::MmapMut::map_anon(4096).expect("anonymous mapping"),
        }
    }
    fn word(&self, k: usize) -> &AtomicU64 {
        assert!(k < 512);
        // SAFETY: 8-byte aligned (page-aligned base), inside the mapping,
        // and only ever accessed atomically (or by the fake kernel while
        // the test waits for it).
        unsafe { &*(self.map.as_ptr().add(8 * k) as *const AtomicU64) }
    }
}

/// A publisher pool with `TARGETS` push subscribers (each its own import in
/// the subscriber's process), replaying the commit graph when `graph`; one
/// frame of 0x5A committed as seq 7; every subscriber's buffer checked;
/// everything closed.
fn commit_round_with(pubd: &Arc<FakeDriver>, subd: &Arc<FakeDriver>, graph: bool) -> vramring::Result<()> {
    let words = Words::new();
    let mut pool = CudaPool::create(Arc::clone(pubd), DeviceSelector::Uuid(GPU), 8 * MIB)?;
    pool.set_commit_graph(if graph { CommitGraph::Always } else { CommitGraph::Never });
    let mut imports: Vec<CudaImport<FakeDriver>> = Vec::new();
    let mut ids = Vec::new();
    for _ in 0..TARGETS {
        let fd: OwnedFd = pool.export_fd()?;
        let mut imp = CudaImport::import(Arc::clone(subd), fd, pool.pool_bytes(), GPU, false)?;
        let (push_fd, bytes) = imp.alloc_push(3, STRIDE)?;
        imports.push(imp);
        ids.push(pool.attach_target(&push_fd, bytes)?);
    }
    // SAFETY: the mapping lives in `words`, declared before the pool, so it
    // outlives the pool's close (which unregisters it).
    let registered = unsafe { pool.register_commit_memory(words.map.as_ptr() as *mut u8, words.map.len()) }?;
    assert!(registered, "the CUDA pool commits in stream order");
    // The gate line (ADR 0011), past the frame: zeroed, then stored by
    // the commit.
    assert!(
        pool.enable_gate_line(GATE)?,
        "the fake device has 64-bit stream memory operations"
    );
    // SAFETY: the pool's first MiB, its own read-write mapping.
    unsafe { pubd.memset_d8(pool.base_addr(), 0x5A, FRAME) }?;
    let writes: Vec<PushWrite<'_>> = ids
        .iter()
        .enumerate()
        .map(|(j, &id)| PushWrite {
            id,
            dst_offset: (j as u64 % 3) * STRIDE,
            push_seq: words.word(10 + j),
        })
        .collect();
    let commit = StreamCommit {
        seq: 7,
        src_offset: 0,
        len: FRAME,
        targets: &writes,
        slot_seq: words.word(1),
        global_seq: words.word(2),
        gate: Some(GATE),
    };
    // SAFETY: every word lies in `words`, registered above.
    unsafe { pool.enqueue_commit(&commit, WriteCompletion::CudaStream(std::ptr::null_mut())) }?;
    pool.complete_writes(WriteCompletion::Host)?;
    assert_eq!(words.word(2).load(Ordering::Acquire), 7, "global_seq");
    assert_eq!(words.word(1).load(Ordering::Acquire), 7, "slot seq");
    let mut gate = [0u8; 8];
    // SAFETY: the gate word lies in the pool's own mapping.
    unsafe { pubd.memcpy_dtoh(&mut gate, pool.base_addr() + GATE) }?;
    assert_eq!(u64::from_le_bytes(gate), 7, "the gate word in the pool");
    for (j, imp) in imports.iter().enumerate() {
        assert_eq!(words.word(10 + j).load(Ordering::Acquire), 7, "push seq of target {j}");
        let mut host = vec![0u8; FRAME as usize];
        // SAFETY: push buffer `j % 3` holds at least FRAME bytes in the
        // subscriber's process.
        unsafe { subd.memcpy_dtoh(&mut host, imp.push_addr(j % 3)) }?;
        assert!(host.iter().all(|&b| b == 0x5A), "target {j}: the frame did not arrive");
    }
    for id in ids {
        pool.detach_target(id)?;
    }
    for mut imp in imports {
        imp.close()?;
    }
    pool.close()?;
    Ok(())
}

#[test]
fn a_commit_copies_into_every_target_before_it_stores_the_seqs() {
    let (pubd, subd) = (publisher_process(), subscriber_process());
    let (fp, fs) = (foreign_current(&pubd), foreign_current(&subd));
    commit_round(&pubd, &subd).unwrap();
    assert_clean(&pubd, fp, "publisher");
    assert_clean(&subd, fs, "subscriber");
    let count = |call: &str| pubd.log().iter().filter(|r| r.call == call).count();
    let (launches, replays) = (count("cuLaunchKernel"), count("cuGraphLaunch"));
    assert_eq!(
        launches + replays,
        TARGETS.div_ceil(MAX_FANOUT),
        "one launch per {MAX_FANOUT} targets"
    );
    assert_eq!(replays, 1, "the last launch, which commits, is the replayed graph");
    // The commit words, and the graph's private descriptor ring.
    assert_eq!(count("cuMemHostRegister_v2"), 2);
}

#[test]
fn without_the_commit_graph_every_commit_launches_and_no_graph_is_made() {
    let (pubd, subd) = (publisher_process(), subscriber_process());
    let (fp, fs) = (foreign_current(&pubd), foreign_current(&subd));
    commit_round_with(&pubd, &subd, false).unwrap();
    assert_clean(&pubd, fp, "publisher");
    assert_clean(&subd, fs, "subscriber");
    let count = |call: &str| pubd.log().iter().filter(|r| r.call == call).count();
    assert_eq!(count("cuLaunchKernel"), TARGETS.div_ceil(MAX_FANOUT));
    assert_eq!(count("cuGraphInstantiateWithFlags") + count("cuGraphLaunch"), 0);
    assert_eq!(count("cuMemHostRegister_v2"), 1, "no descriptor ring");
}

#[test]
fn a_commit_that_fails_at_any_publisher_call_leaves_nothing_behind() {
    let d = publisher_process();
    let before = d.calls();
    commit_round(&d, &subscriber_process()).unwrap();
    let total = d.calls() - before;
    let mut failures = 0;
    for n in 1..=total {
        let (pubd, subd) = (publisher_process(), subscriber_process());
        let (fp, fs) = (foreign_current(&pubd), foreign_current(&subd));
        pubd.fail_at(n);
        failures += u64::from(commit_round(&pubd, &subd).is_err());
        assert_clean(&pubd, fp, &format!("publisher failing at call {n}"));
        assert_clean(&subd, fs, &format!("subscriber with a publisher failing at call {n}"));
    }
    assert!(failures > total / 2, "only {failures} of {total} faults surfaced");
}

/// A publisher pool replaying the commit graph always, with one push
/// subscriber (three buffers of `STRIDE`) and `words` registered as commit
/// memory: the pool, the subscriber's import, the target's id.
fn one_target_pool(
    pubd: &Arc<FakeDriver>,
    subd: &Arc<FakeDriver>,
    words: &Words,
) -> (CudaPool<FakeDriver>, CudaImport<FakeDriver>, u64) {
    one_target_pool_with(pubd, subd, words, CommitGraph::Always)
}

/// Detaches the one target of [`one_target_pool`], closes the import and
/// the pool, and asserts that the publisher's process leaked nothing.
fn close_one_target(pubd: &FakeDriver, (mut pool, mut imp, id): (CudaPool<FakeDriver>, CudaImport<FakeDriver>, u64)) {
    pool.detach_target(id).unwrap();
    imp.close().unwrap();
    pool.close().unwrap();
    assert!(pubd.leaks().is_empty(), "{:?}", pubd.leaks());
}

/// [`one_target_pool`] with the commit graph's `mode`.
fn one_target_pool_with(
    pubd: &Arc<FakeDriver>,
    subd: &Arc<FakeDriver>,
    words: &Words,
    mode: CommitGraph,
) -> (CudaPool<FakeDriver>, CudaImport<FakeDriver>, u64) {
    let mut pool = CudaPool::create(Arc::clone(pubd), DeviceSelector::Uuid(GPU), 8 * MIB).unwrap();
    pool.set_commit_graph(mode);
    let mut imp = CudaImport::import(
        Arc::clone(subd),
        pool.export_fd().unwrap(),
        pool.pool_bytes(),
        GPU,
        false,
    )
    .unwrap();
    let (fd, bytes) = imp.alloc_push(3, STRIDE).unwrap();
    let id = pool.attach_target(&fd, bytes).unwrap();
    // SAFETY: `words` outlives the pool (the callers declare it first).
    unsafe { pool.register_commit_memory(words.map.as_ptr() as *mut u8, 4096) }.unwrap();
    (pool, imp, id)
}

/// One push target's commit of seq 3 with `fail` failing the first
/// time (after `also`, each failing once, if given): the commit fails and
/// stores nothing; a stray word is refused; nothing leaks.
fn a_failed_commit_stores_no_seq(fail: &'static str, also: Option<&'static str>) {
    let (pubd, subd) = (publisher_process(), subscriber_process());
    let words = Words::new();
    let (mut pool, imp, id) = one_target_pool(&pubd, &subd, &words);
    let w = [PushWrite {
        id,
        dst_offset: 0,
        push_seq: words.word(10),
    }];
    let commit = StreamCommit {
        seq: 3,
        src_offset: 0,
        len: FRAME,
        targets: &w,
        slot_seq: words.word(1),
        global_seq: words.word(2),
        gate: None,
    };
    if let Some(a) = also {
        pubd.fail_nth(a, 1);
    }
    pubd.fail_nth(fail, 1);
    // SAFETY: the words lie in `words`, registered above.
    assert!(unsafe { pool.enqueue_commit(&commit, WriteCompletion::Host) }.is_err());
    assert_not_stored(&words, &[1, 2, 10]);
    a_stray_word_is_refused(&mut pool, commit);
    close_one_target(&pubd, (pool, imp, id));
}

#[test]
fn a_failed_graph_launch_stores_no_seq() {
    a_failed_commit_stores_no_seq("cuGraphLaunch", None);
}

#[test]
fn a_failed_kernel_launch_stores_no_seq_where_the_graph_could_not_be_made() {
    a_failed_commit_stores_no_seq("cuLaunchKernel", Some("cuGraphInstantiateWithFlags"));
}

#[test]
fn commits_replay_the_graph_round_its_descriptor_ring_and_launch_where_an_entry_is_not_free() {
    let (pubd, subd) = (publisher_process(), subscriber_process());
    let words = Words::new();
    let (mut pool, imp, id) = one_target_pool(&pubd, &subd, &words);
    let count = |call: &str| pubd.log().iter().filter(|r| r.call == call).count();
    // 150 frames: the 64-entry ring goes round twice. Each frame's bytes
    // differ, and land in the push buffer its descriptor names.
    for seq in 1..=150u64 {
        if seq == 131 {
            // As if frame 67, the last to use the entry frame 131 takes,
            // had not landed yet: this frame launches instead.
            words.word(2).store(66, Ordering::Release);
        }
        assert_eq!(
            commit_frame_path(&pubd, &subd, (&mut pool, &imp, id), &words, seq),
            if seq == 131 { "launch" } else { "replay" },
            "frame {seq}: a launch only where the ring entry is not free"
        );
    }
    assert_eq!(count("cuGraphLaunch"), 149);
    assert_eq!(count("cuGraphInstantiateWithFlags"), 1, "one graph, made once");
    close_one_target(&pubd, (pool, imp, id));
}

#[test]
fn by_default_a_ring_replays_while_it_publishes_fast_and_launches_after_a_pause() {
    assert_eq!(
        CommitGraph::default(),
        CommitGraph::Within(vramring::seam::cuda::COMMIT_GRAPH_WITHIN)
    );
    // A wide bound, so that only a stall of a second between frames sent
    // back to back could reach it; the pause below is longer than 1.5
    // times it.
    let within = std::time::Duration::from_secs(1);
    let (pubd, subd) = (publisher_process(), subscriber_process());
    let words = Words::new();
    let (mut pool, imp, id) = one_target_pool_with(&pubd, &subd, &words, CommitGraph::Within(within));
    let count = |call: &str| pubd.log().iter().filter(|r| r.call == call).count();
    let mut frame = |seq: u64| commit_frame_path(&pubd, &subd, (&mut pool, &imp, id), &words, seq);
    assert_eq!(frame(1), "launch", "a ring's first push commit has no pace yet");
    assert_eq!(count("cuGraphInstantiateWithFlags"), 0, "no graph until one replays");
    for seq in 2..=6 {
        assert_eq!(frame(seq), "replay", "frame {seq} came right after the previous one");
    }
    std::thread::sleep(within * 2);
    assert_eq!(frame(7), "launch", "frame 7 came after a pause");
    assert_eq!(frame(8), "launch", "one fast frame does not bring the average down");
    let after: Vec<&str> = (9..=20).map(&mut frame).collect();
    let first = after
        .iter()
        .position(|&p| p == "replay")
        .expect("the ring replays again at a fast pace");
    assert!(after[first..].iter().all(|&p| p == "replay"), "{after:?}");
    assert_eq!(count("cuGraphInstantiateWithFlags"), 1, "one graph, made once");
    close_one_target(&pubd, (pool, imp, id));
}

#[test]
fn a_ring_that_never_publishes_within_the_window_never_makes_a_graph() {
    let (pubd, subd) = (publisher_process(), subscriber_process());
    let words = Words::new();
    let (mut pool, imp, id) =
        one_target_pool_with(&pubd, &subd, &words, CommitGraph::Within(std::time::Duration::ZERO));
    for seq in 1..=3u64 {
        std::thread::sleep(std::time::Duration::from_millis(2));
        commit_frame(
            &pubd,
            &subd,
            (&mut pool, &imp, id),
            &words,
            seq,
            FRAME,
            seq as usize % 3,
        );
    }
    let count = |call: &str| pubd.log().iter().filter(|r| r.call == call).count();
    assert_eq!(count("cuLaunchKernel"), 3);
    assert_eq!(count("cuGraphInstantiateWithFlags") + count("cuGraphLaunch"), 0);
    assert_eq!(count("cuMemHostRegister_v2"), 1, "no descriptor ring");
    close_one_target(&pubd, (pool, imp, id));
}

/// Fills the pool's first `FRAME` bytes with `seq as u8`, commits `len`
/// of them as frame `seq` into push buffer `k` of the one target of
/// [`one_target_pool`], and checks that the seqs and the bytes arrived.
fn commit_frame(
    pubd: &FakeDriver,
    subd: &FakeDriver,
    (pool, imp, id): (&mut CudaPool<FakeDriver>, &CudaImport<FakeDriver>, u64),
    words: &Words,
    seq: u64,
    len: u64,
    k: usize,
) {
    // SAFETY: the pool's first MiB, its own read-write mapping.
    unsafe { pubd.memset_d8(pool.base_addr(), seq as u8, FRAME) }.unwrap();
    let w = [PushWrite {
        id,
        dst_offset: k as u64 * STRIDE,
        push_seq: words.word(10),
    }];
    let commit = StreamCommit {
        seq,
        src_offset: 0,
        len,
        targets: &w,
        slot_seq: words.word(1),
        global_seq: words.word(2),
        gate: None,
    };
    // SAFETY: the words lie in `words`, registered with the pool.
    unsafe { pool.enqueue_commit(&commit, WriteCompletion::Host) }.unwrap();
    assert_eq!(words.word(2).load(Ordering::Acquire), seq, "global_seq of frame {seq}");
    assert_eq!(words.word(10).load(Ordering::Acquire), seq, "push seq of frame {seq}");
    let mut host = vec![0u8; len as usize];
    // SAFETY: push buffer `k` holds at least FRAME bytes.
    unsafe { subd.memcpy_dtoh(&mut host, imp.push_addr(k)) }.unwrap();
    assert!(host.iter().all(|&b| b == seq as u8), "frame {seq} did not arrive whole");
}

/// [`commit_frame`] of frame `seq` (whole, into push buffer `seq % 3`):
/// `"launch"` or `"replay"`, the way it was committed.
fn commit_frame_path(
    pubd: &FakeDriver,
    subd: &FakeDriver,
    target: (&mut CudaPool<FakeDriver>, &CudaImport<FakeDriver>, u64),
    words: &Words,
    seq: u64,
) -> &'static str {
    let count = |call: &str| pubd.log().iter().filter(|r| r.call == call).count();
    let (launches, replays) = (count("cuLaunchKernel"), count("cuGraphLaunch"));
    commit_frame(pubd, subd, target, words, seq, FRAME, (seq % 3) as usize);
    match (count("cuLaunchKernel") - launches, count("cuGraphLaunch") - replays) {
        (1, 0) => "launch",
        (0, 1) => "replay",
        other => panic!("frame {seq}: {other:?} launches and replays"),
    }
}

/// Asserts that a failed commit stored none of the words `ks`.
fn assert_not_stored(words: &Words, ks: &[usize]) {
    for &k in ks {
        assert_eq!(
            words.word(k).load(Ordering::Acquire),
            0,
            "word {k} was stored by a failed commit"
        );
    }
}

/// [`commit_round_with`] the commit graph.
fn commit_round(pubd: &Arc<FakeDriver>, subd: &Arc<FakeDriver>) -> vramring::Result<()> {
    commit_round_with(pubd, subd, true)
}

/// `commit` with its `global_seq` outside registered memory is refused
/// before anything is enqueued, and the stray word is never stored.
fn a_stray_word_is_refused(pool: &mut CudaPool<FakeDriver>, commit: StreamCommit<'_>) {
    let stray = AtomicU64::new(0);
    let bad = StreamCommit {
        global_seq: &stray,
        ..commit
    };
    // SAFETY: refused before anything is enqueued (the word is checked
    // first), so nothing ever writes the stray word.
    assert!(unsafe { pool.enqueue_commit(&bad, WriteCompletion::Host) }.is_err());
    assert_eq!(stray.load(Ordering::Relaxed), 0);
}

/// A publisher pool with a gate line and no push target, commit memory
/// registered; the caller commits into it.
fn pull_only_pool(pubd: &Arc<FakeDriver>, words: &Words) -> CudaPool<FakeDriver> {
    let mut pool = CudaPool::create(Arc::clone(pubd), DeviceSelector::Uuid(GPU), 8 * MIB).unwrap();
    // SAFETY: `words` outlives the pool (the callers declare it first).
    unsafe { pool.register_commit_memory(words.map.as_ptr() as *mut u8, 4096) }.unwrap();
    assert!(pool.enable_gate_line(GATE).unwrap());
    pool
}

fn pull_only_commit(words: &Words, seq: u64) -> StreamCommit<'_> {
    StreamCommit {
        seq,
        src_offset: 0,
        len: FRAME,
        targets: &[],
        slot_seq: words.word(1),
        global_seq: words.word(2),
        gate: Some(GATE),
    }
}

fn gate_word(d: &FakeDriver, pool: &CudaPool<FakeDriver>) -> u64 {
    let mut gate = [0u8; 8];
    // SAFETY: the gate word lies in the pool's own mapping.
    unsafe { d.memcpy_dtoh(&mut gate, pool.base_addr() + GATE) }.unwrap();
    u64::from_le_bytes(gate)
}

#[test]
fn a_commit_with_no_push_target_is_one_batched_memory_operation_and_no_launch() {
    let pubd = publisher_process();
    let words = Words::new();
    let mut pool = pull_only_pool(&pubd, &words);
    let before = pubd.log().len();
    // SAFETY: the words lie in `words`, registered above.
    unsafe {
        pool.enqueue_commit(
            &pull_only_commit(&words, 9),
            WriteCompletion::CudaStream(std::ptr::null_mut()),
        )
    }
    .unwrap();
    pool.complete_writes(WriteCompletion::Host).unwrap();
    let calls: Vec<&str> = pubd.log()[before..].iter().map(|r| r.call).collect();
    assert_eq!(
        calls.iter().filter(|&&c| c == "cuStreamBatchMemOp_v2").count(),
        1,
        "{calls:?}"
    );
    assert!(!calls.contains(&"cuLaunchKernel"), "{calls:?}");
    assert_eq!(gate_word(&pubd, &pool), 9, "the gate word");
    assert_eq!(words.word(1).load(Ordering::Acquire), 9, "slot seq");
    assert_eq!(words.word(2).load(Ordering::Acquire), 9, "global_seq");
    pool.close().unwrap();
    assert!(pubd.leaks().is_empty(), "{:?}", pubd.leaks());
}

#[test]
fn a_failed_batched_commit_stores_no_seq_and_a_word_outside_registered_memory_is_refused() {
    let pubd = publisher_process();
    let words = Words::new();
    let mut pool = pull_only_pool(&pubd, &words);
    pubd.fail_nth("cuStreamBatchMemOp_v2", 1);
    // SAFETY: the words lie in `words`, registered above.
    assert!(unsafe { pool.enqueue_commit(&pull_only_commit(&words, 4), WriteCompletion::Host) }.is_err());
    assert_eq!(gate_word(&pubd, &pool), 0, "the gate was stored by a failed commit");
    assert_not_stored(&words, &[1, 2]);
    a_stray_word_is_refused(&mut pool, pull_only_commit(&words, 5));
    assert_eq!(gate_word(&pubd, &pool), 0);
    // The next commit goes through.
    // SAFETY: as above.
    unsafe { pool.enqueue_commit(&pull_only_commit(&words, 6), WriteCompletion::Host) }.unwrap();
    pool.complete_writes(WriteCompletion::Host).unwrap();
    assert_eq!(words.word(2).load(Ordering::Acquire), 6);
    pool.close().unwrap();
    assert!(pubd.leaks().is_empty(), "{:?}", pubd.leaks());
}

#[test]
fn a_commit_marks_its_stages_for_a_tracing_subscriber() {
    // `on_this_thread` keeps the interest of callsites that the other tests'
    // threads hit first (the test kit says how).
    let (marks, guard) = marks::StageMarks::on_this_thread();
    let (pubd, subd) = (publisher_process(), subscriber_process());
    let words = Words::new();
    let mut pool = pull_only_pool(&pubd, &words);
    let take = || marks.take_stages();
    // One commit through the graph, one launched.
    commit_round(&pubd, &subd).unwrap();
    let with_graph = take();
    commit_round_with(&pubd, &subd, false).unwrap();
    let with_kernel = take();
    // With no push target, the batched stores instead of the kernel.
    // SAFETY: the words lie in `words`, registered with the pool.
    unsafe { pool.enqueue_commit(&pull_only_commit(&words, 2), WriteCompletion::Host) }.unwrap();
    let stores_only = take();
    drop(guard);
    pool.close().unwrap();
    // The wake bench's `--probe` times these (PERF.md): the driver's part of
    // the commit lies between them.
    assert_eq!(with_graph, ["context current", "graph replayed"]);
    assert_eq!(with_kernel, ["context current", "kernel launched"]);
    assert_eq!(stores_only, ["context current", "stores enqueued"]);
}

#[test]
fn a_commit_of_another_size_launches_and_the_graph_serves_the_next() {
    let (pubd, subd) = (publisher_process(), subscriber_process());
    let words = Words::new();
    let (mut pool, imp, id) = one_target_pool(&pubd, &subd, &words);
    let count = |call: &str| pubd.log().iter().filter(|r| r.call == call).count();
    // The graph is made for the first commit's grid; the second, half the
    // size, needs another grid and launches; the third is the graph's again.
    for (seq, len) in [(1u64, FRAME), (2, FRAME / 2), (3, FRAME)] {
        let (launches, replays) = (count("cuLaunchKernel"), count("cuGraphLaunch"));
        commit_frame(&pubd, &subd, (&mut pool, &imp, id), &words, seq, len, 0);
        let replayed = count("cuGraphLaunch") - replays;
        assert_eq!(
            (count("cuLaunchKernel") - launches, replayed),
            if seq == 2 { (1, 0) } else { (0, 1) }
        );
    }
    assert_eq!(count("cuGraphInstantiateWithFlags"), 1, "the graph is kept, not remade");
    close_one_target(&pubd, (pool, imp, id));
}
