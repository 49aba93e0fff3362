//! The stream-order commit kernel: push copies and the commit of a frame in
//! one launch, enqueued behind the frame's writes on the writer's stream.
//!
//! One launch of `vramring_commit` reads the slot once and writes it into up
//! to [`MAX_FANOUT`] push targets (16-byte vectors, grid-stride). Each
//! block synchronises (`bar.sync`), then its thread 0 fences at device
//! scope (`membar.gl`, cumulative over the block's stores it synchronised
//! with, as cooperative groups' grid sync does) and counts the block done
//! on a counter word; the last block to finish (the classic
//! threadfence-reduction pattern) issues a system-scope fence
//! (`membar.sys`), stores the frame's seq into the pool's gate word when
//! the ring has one (device memory, where queued pull copies see it sooner
//! than a host word, and may start from here on; ADR 0011), then into each
//! target's `push_seq` word and into the slot's seq word, then fences again
//! and stores `global_seq`. Those words live in the publisher's host shared
//! memory, registered with `cuMemHostRegister` and reached through its
//! device mapping, so a subscriber polling them on the CPU sees them the
//! moment the GPU has stored them, with no CPU work in the publisher. The
//! two system fences give the order the protocol needs (PROTOCOL.md
//! §10.1): the frame's bytes and every push copy, then the push and slot
//! seqs, then `global_seq`.
//!
//! The counter words (64 of them, indexed by `seq % 64`, reset by the last
//! block) are a small device allocation of the publisher's; commits of one
//! ring are ordered on the GPU (the publisher waits for the previous commit
//! when the writer's stream changes), so a word is never shared by two
//! launches in flight.
//!
//! **A replayed graph (ADR 0021).** A kernel launch is the bulk of a
//! publish's CPU cost, and a replayed graph costs the CPU less than a
//! launch (`benches/submit.rs`). A graph's parameters are fixed when it is
//! made, so the graph path takes its descriptor from memory instead:
//! the publisher writes each frame's descriptor into the next entry of a
//! ring of [`RING_ENTRIES`] in its own private host memory (registered,
//! never shared with a subscriber), then launches a graph of two nodes:
//! `vramring_commit_fetch` (one block) reads a count of entries used from
//! device memory, copies that entry into a device-memory descriptor and
//! counts one more; `vramring_commit_at` is the commit kernel reading its
//! descriptor from there. Runs of one graph instance are ordered (each
//! after the instance's previous run) and commits of one ring are ordered
//! on the GPU, so run `n` reads entry `n % RING_ENTRIES`, the one the CPU
//! wrote for it. An entry is written again only once the frame that last
//! used it has landed (`global_seq`); until then, and for any frame the
//! graph was not made for (another grid, more than [`MAX_FANOUT`]
//! targets), the publisher launches the kernel with its descriptor by
//! value.
//!
//! **Only when the ring publishes often** ([`CommitGraph`], ADR 0022). The
//! graph saves CPU over the launch when commits come close together and
//! costs more at camera rates (its fetch node adds a little latency too;
//! `docs/PERF.md`, "Commit graph or kernel launch, by the ring's pace"), so
//! by default a ring replays only while its push commits come on average at
//! most [`COMMIT_GRAPH_WITHIN`] apart (see [`Pace`]) and launches otherwise;
//! the graph is made at the first commit that replays it, so a ring that
//! never publishes that fast never makes one. [`CommitGraph::Always`] (or
//! `Never`) in the ring's configuration replays (or launches) always.

use std::ffi::c_void;

use super::driver::{CuFunction, CuGraphExec, CuModule, CuStream, DResult, DevicePtr, Driver, KernelNode};
use crate::sync::atomic::{AtomicU64, Ordering};

/// Name of the commit kernel.
pub const COMMIT_KERNEL: &str = "vramring_commit";
/// Name of the commit kernel that reads its descriptor from device memory.
pub const COMMIT_AT_KERNEL: &str = "vramring_commit_at";
/// Name of the kernel that copies a descriptor from the ring.
pub const FETCH_KERNEL: &str = "vramring_commit_fetch";

/// By default a ring replays the commit graph while its push commits come
/// on average at most this far apart ([`CommitGraph::AUTO`]): the graph
/// costs the producer's CPU less than a launch when commits come close
/// together and more at slower paces, and this bound lies between the two
/// (`docs/PERF.md`, "Commit graph or kernel launch, by the ring's pace";
/// ADR 0022).
pub const COMMIT_GRAPH_WITHIN: std::time::Duration = std::time::Duration::from_millis(4);

/// When a push commit replays the commit graph instead of launching the
/// commit kernel. Either way the GPU does the same stores in the same
/// order; only the producer's CPU cost and, by the graph's fetch node, a
/// little latency differ (ADR 0021, ADR 0022).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitGraph {
    /// Every push commit launches the kernel; no graph is made.
    Never,
    /// Every push commit that can replays the graph.
    Always,
    /// The ring replays the graph while its push commits come on average
    /// at most this far apart: it starts once the average of the recent
    /// intervals between them is at most this, and goes back to launching
    /// at the first interval longer than one and a half times it (a
    /// pause, a slower source). A ring's first commit launches, and the
    /// graph is made at the first replay.
    Within(std::time::Duration),
}

impl CommitGraph {
    /// The default: [`CommitGraph::Within`] [`COMMIT_GRAPH_WITHIN`].
    pub const AUTO: CommitGraph = CommitGraph::Within(COMMIT_GRAPH_WITHIN);
}

/// `always` (or `1`), `never` (or `0`), `auto` (or empty): the words a
/// binary's flag or environment variable takes.
impl std::str::FromStr for CommitGraph {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.trim() {
            "always" | "1" => Ok(CommitGraph::Always),
            "never" | "0" => Ok(CommitGraph::Never),
            "auto" | "" => Ok(CommitGraph::AUTO),
            other => Err(format!("commit graph mode {other:?} is not always, never or auto")),
        }
    }
}

impl Default for CommitGraph {
    fn default() -> Self {
        CommitGraph::AUTO
    }
}

/// A ring's pace for [`CommitGraph::Within`]: the average interval between
/// its push commits (each new interval weighs 1/8) and whether it replays.
/// Deciding on the average, and stopping only past one and a half times
/// the bound, keeps a source whose intervals jitter around the bound from
/// switching between the two paths frame by frame, which costs more than
/// either path alone because neither stays warm (ADR 0022).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Pace {
    /// When the previous push commit was enqueued.
    last: Option<std::time::Instant>,
    average: Option<std::time::Duration>,
    replaying: bool,
}

impl Pace {
    /// A push commit enqueued at `now`: [`next`](Self::next) with the
    /// interval since the previous one.
    pub(crate) fn at(&mut self, within: std::time::Duration, now: std::time::Instant) -> bool {
        let interval = self.last.map(|t| now.saturating_duration_since(t));
        self.last = Some(now);
        self.next(within, interval)
    }

    /// Takes the interval since the ring's previous push commit (`None`:
    /// this is its first) and says whether this commit replays, for the
    /// bound `within`.
    pub(crate) fn next(&mut self, within: std::time::Duration, interval: Option<std::time::Duration>) -> bool {
        let Some(i) = interval else {
            return false;
        };
        if i > within + within / 2 {
            // A pause or a slower source: launch, and start averaging
            // afresh from this interval.
            self.average = Some(i);
            self.replaying = false;
            return false;
        }
        let average = match self.average {
            Some(a) if i >= a => a + (i - a) / 8,
            Some(a) => a - (a - i) / 8,
            None => i,
        };
        self.average = Some(average);
        self.replaying |= average <= within;
        self.replaying
    }
}

/// Entries of the descriptor ring.
pub const RING_ENTRIES: usize = 64;
/// Bytes of the device state: the count of entries used, then (at
/// [`STATE_DESC`]) the descriptor.
const STATE_BYTES: u64 = 256;
const STATE_DESC: u64 = 64;
/// Threads of the fetch kernel's one block (12 move the descriptor).
const FETCH_THREADS: u32 = 32;
const _: () = assert!(FETCH_THREADS >= 12);

/// Push targets one launch writes; more take several launches, only the
/// last of which stores the slot seq and `global_seq`.
pub const MAX_FANOUT: usize = 8;

/// Counter words, one per `seq % COUNTERS`.
const COUNTERS: u64 = 64;
const THREADS: u32 = 256;
const MAX_BLOCKS: u32 = 2048;

/// The kernel's one parameter, by value (192 bytes, as the PTX reads it).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitDesc {
    /// Device address of the slot's first byte.
    pub src: DevicePtr,
    /// 16-byte vectors to copy into each target.
    pub vecs: u64,
    /// Targets in `dst` / `push_seq` (at most [`MAX_FANOUT`]).
    pub count: u64,
    /// The frame's seq.
    pub seq: u64,
    /// Device address of the counter words.
    pub counter: DevicePtr,
    /// Device address of the slot's seq word (registered host memory), or 0.
    pub slot_seq: DevicePtr,
    /// Device address of `global_seq` (registered host memory), or 0.
    pub global_seq: DevicePtr,
    /// Device address of the pool's gate word (device memory), or 0.
    pub gate: DevicePtr,
    /// Device addresses of the targets' buffers.
    pub dst: [DevicePtr; MAX_FANOUT],
    /// Device addresses of the targets' `push_seq` words (registered host memory).
    pub push_seq: [DevicePtr; MAX_FANOUT],
}

const _: () = assert!(std::mem::size_of::<CommitDesc>() == 192);
const _: () = assert!(std::mem::offset_of!(CommitDesc, dst) == 64);
const _: () = assert!(std::mem::offset_of!(CommitDesc, push_seq) == 128);

/// Where the kernel's registers come from: (register, byte offset in the
/// descriptor). %rd1 src, %rd2 vecs, %rd3 count, %rd4 seq, %rd5 counters,
/// %rd6 slot seq word, %rd7 global seq word, %rd8 gate word, %rd10-17 dst,
/// %rd20-27 push seq words.
const DESC_WORDS: [(u32, u32); 24] = [
    (1, 0),
    (2, 8),
    (3, 16),
    (4, 24),
    (5, 32),
    (6, 40),
    (7, 48),
    (8, 56),
    (10, 64),
    (11, 72),
    (12, 80),
    (13, 88),
    (14, 96),
    (15, 104),
    (16, 112),
    (17, 120),
    (20, 128),
    (21, 136),
    (22, 144),
    (23, 152),
    (24, 160),
    (25, 168),
    (26, 176),
    (27, 184),
];

/// The commit kernel's work once its descriptor is in registers (see
/// [`DESC_WORDS`]; %p0-7 "target j exists"), shared by both entry points.
const COMMIT_BODY: &str = include_str!("ptx/commit_body.ptx");

/// `vramring_commit_fetch`, one block of [`FETCH_THREADS`]: reads the count
/// of descriptors used (device memory, the state's first word), copies that
/// ring entry (`count % RING_ENTRIES`, mapped host memory, read over the
/// bus) into the state's descriptor, then counts one more. Its threads
/// 0-11 move one 16-byte part each; the count is stored after the block's
/// barrier, so every thread read it first.
const FETCH_PTX: &str = include_str!("ptx/commit_fetch.ptx");

/// The module's PTX: `vramring_commit` (descriptor by value),
/// `vramring_commit_at` (descriptor in device memory, at its one
/// parameter) and `vramring_commit_fetch`.
fn ptx() -> std::ffi::CString {
    let mut by_value = String::new();
    let mut at = String::from("    ld.param.u64 %rd40, [p_at];\n    cvta.to.global.u64 %rd40, %rd40;\n");
    for (reg, off) in DESC_WORDS {
        by_value.push_str(&format!("    ld.param.u64 %rd{reg}, [p_desc+{off}];\n"));
        at.push_str(&format!("    ld.global.u64 %rd{reg}, [%rd40+{off}];\n"));
    }
    let regs = "    .reg .pred %p<16>;\n    .reg .b32 %r<16>;\n    .reg .b64 %rd<48>;\n";
    let text = format!(
        "//\n// vramring stream-order commit (see src/memory/cuda/commit.rs)\n//\n.version 7.0\n.target sm_70\n.address_size 64\n\n\
         .visible .entry {COMMIT_KERNEL}(\n    .param .align 8 .b8 p_desc[192]\n)\n{{\n{regs}{by_value}{COMMIT_BODY}\n\
         .visible .entry {COMMIT_AT_KERNEL}(\n    .param .u64 p_at\n)\n{{\n{regs}{at}{COMMIT_BODY}{FETCH_PTX}"
    );
    // No NUL can be in it: every piece is a literal above.
    std::ffi::CString::new(text).unwrap_or_default()
}

/// The commit kernel loaded into a context, with its counter words and,
/// once a push commit has replayed it, its commit graph. Made and released
/// with that context current (the pool pushes it).
#[derive(Debug)]
pub(crate) struct CommitKernel {
    module: Option<CuModule>,
    function: CuFunction,
    at: CuFunction,
    fetch: CuFunction,
    counters: Option<DevicePtr>,
    replay: Replay,
    mode: CommitGraph,
    pace: Pace,
}

/// How a commit was enqueued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Enqueued {
    /// One launch of the kernel, its descriptor by value.
    Launched,
    /// One run of the replayed graph.
    Replayed,
}

/// The graph path's state.
#[derive(Debug)]
enum Replay {
    /// Not made yet; made at the first commit that replays it.
    Untried,
    /// Made for one grid.
    Ready(Box<Graph>),
    /// [`CommitGraph::Never`], or making it failed: every commit launches.
    Off,
}

/// A replayed commit graph and the memory it reads.
#[derive(Debug)]
struct Graph {
    exec: Option<CuGraphExec>,
    /// Blocks of the commit node (the grid it was made for).
    blocks: u32,
    /// The descriptor ring: private, registered host memory.
    ring: memmap2::MmapMut,
    registered: bool,
    /// Device memory: the count of entries used, then the descriptor.
    state: Option<DevicePtr>,
    /// Graph runs launched (the next entry is `launched % RING_ENTRIES`).
    launched: u64,
    /// The frame seq that last used each entry.
    entry_seq: [u64; RING_ENTRIES],
}

/// Blocks of `THREADS` for a copy of `vecs` 16-byte vectors.
fn blocks_for(vecs: u64) -> u32 {
    u32::try_from(vecs.div_ceil(u64::from(THREADS)))
        .unwrap_or(MAX_BLOCKS)
        .clamp(1, MAX_BLOCKS)
}

impl CommitKernel {
    /// Loads the kernels and makes the zeroed counter words, in the current
    /// context; `mode`: when push commits replay the commit graph (made at
    /// the first that does). On failure releases what it made.
    pub(crate) fn load<D: Driver>(d: &D, mode: CommitGraph) -> DResult<CommitKernel> {
        let module = d.module_load_data(&ptx())?;
        let made = (|| {
            let get = |name: &str| {
                let name = std::ffi::CString::new(name).unwrap_or_default();
                // SAFETY: `module` was just loaded by this driver.
                unsafe { d.module_get_function(module, &name) }
            };
            let (function, at, fetch) = (get(COMMIT_KERNEL)?, get(COMMIT_AT_KERNEL)?, get(FETCH_KERNEL)?);
            let counters = d.mem_alloc(COUNTERS * 4)?;
            // SAFETY: `counters` was just allocated with this many bytes.
            if let Err(e) = unsafe { d.memset_d8(counters, 0, COUNTERS * 4) } {
                // SAFETY: allocated above, unused.
                if let Err(fe) = unsafe { d.mem_free(counters) } {
                    tracing::warn!(error = %fe, "freeing the commit counters after a failed memset");
                }
                return Err(e);
            }
            Ok((function, at, fetch, counters))
        })();
        match made {
            Ok((function, at, fetch, counters)) => Ok(CommitKernel {
                module: Some(module),
                function,
                at,
                fetch,
                counters: Some(counters),
                replay: if mode == CommitGraph::Never {
                    Replay::Off
                } else {
                    Replay::Untried
                },
                mode,
                pace: Pace::default(),
            }),
            Err(e) => {
                // SAFETY: loaded above; nothing of it runs.
                if let Err(ue) = unsafe { d.module_unload(module) } {
                    tracing::warn!(error = %ue, "unloading the commit kernel after a failed load");
                }
                Err(e)
            }
        }
    }

    /// Enqueues one commit on `stream`: through the replayed graph when its
    /// [`CommitGraph`] mode says so and it can (see the module's doc), else
    /// one launch with the descriptor by value; says which. `desc.counter`
    /// is filled in here. `global_seq` is the ring's word the commit stores
    /// last, read to know which ring entries are free again.
    ///
    /// # Safety
    /// The kernel's context is current; every address in `desc` is live
    /// device memory (or registered host memory) that stays valid until
    /// the commit has completed; the source is 16-byte aligned and
    /// readable, each target 16-byte aligned and writable for
    /// `desc.vecs * 16` bytes.
    pub(crate) unsafe fn launch<D: Driver>(
        &mut self,
        d: &D,
        stream: CuStream,
        mut desc: CommitDesc,
        global_seq: &AtomicU64,
    ) -> DResult<Enqueued> {
        desc.counter = self.counters.unwrap_or(0);
        let blocks = blocks_for(desc.vecs);
        // Only a whole commit with push targets (it stores `global_seq`,
        // which frees its entry again) goes through the graph.
        if desc.count > 0 && desc.global_seq != 0 {
            let replays = match self.mode {
                CommitGraph::Never => false,
                CommitGraph::Always => true,
                CommitGraph::Within(within) => self.pace.at(within, std::time::Instant::now()),
            };
            if !replays {
                // SAFETY: this method's contract.
                return unsafe { self.launch_by_value(d, stream, desc, blocks) }.map(|()| Enqueued::Launched);
            }
            if matches!(self.replay, Replay::Untried) {
                self.replay = match self.make_graph(d, blocks) {
                    Ok(g) => Replay::Ready(Box::new(g)),
                    Err(e) => {
                        tracing::debug!(error = %e, "no replayed commit graph; every commit launches");
                        Replay::Off
                    }
                };
            }
            if let Replay::Ready(g) = &mut self.replay {
                let entry = (g.launched % RING_ENTRIES as u64) as usize;
                // SYNC: global-seq — Acquire pairs with the commit kernel's
                // store: the frame that last used this entry has landed, so
                // its fetch node read the entry long before.
                let free = global_seq.load(Ordering::Acquire) >= g.entry_seq[entry];
                if let (true, Some(exec)) = (g.blocks == blocks && free, g.exec) {
                    // SAFETY: the entry lies in the ring's mapping (64
                    // entries of 192 bytes); the GPU reads it only in the
                    // run launched next (free, checked above).
                    unsafe {
                        g.ring
                            .as_mut_ptr()
                            .add(entry * std::mem::size_of::<CommitDesc>())
                            .cast::<CommitDesc>()
                            .write_volatile(desc);
                    }
                    // The entry's bytes before the launch's doorbell.
                    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
                    // SAFETY: the graph's nodes read the ring and the state
                    // (live until `release`, after a synchronise) and the
                    // descriptor's addresses (this method's contract).
                    unsafe { d.graph_launch(exec, stream) }?;
                    g.launched += 1;
                    g.entry_seq[entry] = desc.seq;
                    return Ok(Enqueued::Replayed);
                }
            }
        }
        // SAFETY: this method's contract.
        unsafe { self.launch_by_value(d, stream, desc, blocks) }.map(|()| Enqueued::Launched)
    }

    /// One launch of the commit kernel with `desc` by value.
    ///
    /// # Safety
    /// As for [`launch`](Self::launch).
    unsafe fn launch_by_value<D: Driver>(
        &self,
        d: &D,
        stream: CuStream,
        mut desc: CommitDesc,
        blocks: u32,
    ) -> DResult<()> {
        let mut params = [(&mut desc as *mut CommitDesc).cast::<c_void>()];
        // SAFETY: the one parameter is a `CommitDesc`, as the PTX declares
        // it; the addresses in it are valid (this function's contract).
        unsafe { d.launch_kernel(self.function, blocks, THREADS, stream, &mut params) }
    }

    /// Makes the replayed graph for commits of `blocks` blocks: the ring
    /// (mapped, registered), the device state (zeroed) and the graph. On
    /// failure releases what it made.
    fn make_graph<D: Driver>(&self, d: &D, blocks: u32) -> crate::Result<Graph> {
        let bytes = RING_ENTRIES * std::mem::size_of::<CommitDesc>();
        let ring =
            memmap2::MmapMut::map_anon(bytes).map_err(|e| crate::Error::io("mapping the commit descriptor ring", e))?;
        let mut g = Graph {
            exec: None,
            blocks,
            ring,
            registered: false,
            state: None,
            launched: 0,
            entry_seq: [0; RING_ENTRIES],
        };
        let made = (|| -> DResult<()> {
            let ring = g.ring.as_mut_ptr().cast::<c_void>();
            // SAFETY: the ring is this graph's own mapping, unmapped only
            // after it is unregistered (`Graph::release`).
            unsafe { d.mem_host_register(ring, bytes as u64) }?;
            g.registered = true;
            // SAFETY: registered just above.
            let ring_dev = unsafe { d.mem_host_device_pointer(ring) }?;
            let state = d.mem_alloc(STATE_BYTES)?;
            g.state = Some(state);
            // SAFETY: just allocated with this many bytes.
            unsafe { d.memset_d8(state, 0, STATE_BYTES) }?;
            let nodes = [
                KernelNode {
                    function: self.fetch,
                    grid: 1,
                    block: FETCH_THREADS,
                    params: vec![ring_dev, state],
                },
                KernelNode {
                    function: self.at,
                    grid: blocks,
                    block: THREADS,
                    params: vec![state + STATE_DESC],
                },
            ];
            // SAFETY: the fetch kernel takes two 64-bit parameters and the
            // commit-at kernel one (the PTX above).
            g.exec = Some(unsafe { d.graph_of_kernels(&nodes) }?);
            Ok(())
        })();
        match made {
            Ok(()) => Ok(g),
            Err(e) => {
                if let Err(re) = g.release(d) {
                    tracing::warn!(error = %re, "releasing a commit graph that could not be made");
                }
                Err(e.into())
            }
        }
    }

    /// Frees the graph, the counters and unloads the module, in the current
    /// context (the kernel's); every launch has completed. Retryable.
    pub(crate) fn release<D: Driver>(&mut self, d: &D) -> DResult<()> {
        if let Replay::Ready(g) = &mut self.replay {
            g.release(d)?;
            self.replay = Replay::Off;
        }
        if let Some(c) = self.counters {
            // SAFETY: allocated by `load`; the caller synchronised the context.
            unsafe { d.mem_free(c) }?;
            self.counters = None;
        }
        if let Some(m) = self.module {
            // SAFETY: loaded by `load`; no launch is pending.
            unsafe { d.module_unload(m) }?;
            self.module = None;
        }
        Ok(())
    }
}

impl Graph {
    /// Destroys the instance, frees the state and unregisters the ring;
    /// nothing of it runs (the context is synchronised, or it never ran).
    /// Retryable.
    fn release<D: Driver>(&mut self, d: &D) -> DResult<()> {
        if let Some(x) = self.exec {
            // SAFETY: instantiated by `make_graph`; no run is pending.
            unsafe { d.graph_exec_destroy(x) }?;
            self.exec = None;
        }
        if let Some(s) = self.state {
            // SAFETY: allocated by `make_graph`; no run reads it.
            unsafe { d.mem_free(s) }?;
            self.state = None;
        }
        if self.registered {
            // SAFETY: registered by `make_graph`; no run reads it.
            unsafe { d.mem_host_unregister(self.ring.as_mut_ptr().cast()) }?;
            self.registered = false;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_descriptor_has_the_layout_the_ptx_reads() {
        let d = CommitDesc::default();
        let base = &d as *const CommitDesc as usize;
        let at = |p: *const u64| p as usize - base;
        assert_eq!(at(&d.src), 0);
        assert_eq!(at(&d.vecs), 8);
        assert_eq!(at(&d.count), 16);
        assert_eq!(at(&d.seq), 24);
        assert_eq!(at(&d.counter), 32);
        assert_eq!(at(&d.slot_seq), 40);
        assert_eq!(at(&d.global_seq), 48);
        assert_eq!(at(&d.gate), 56);
        assert_eq!(at(&d.dst[7]), 120);
        assert_eq!(at(&d.push_seq[0]), 128);
        assert_eq!(at(&d.push_seq[7]), 184);
        let ptx = ptx().into_string().unwrap();
        assert!(ptx.contains("[p_desc+56]"), "the gate word is not read");
        for (k, off) in (64..192).step_by(8).enumerate() {
            assert!(
                ptx.contains(&format!("[p_desc+{off}]")),
                "target word {k} at +{off} is not read"
            );
        }
        assert!(ptx.contains(".param .align 8 .b8 p_desc[192]"));
        // The entry that reads its descriptor from memory reads the same
        // words at the same offsets, into the same registers.
        for (reg, off) in DESC_WORDS {
            assert!(ptx.contains(&format!("ld.param.u64 %rd{reg}, [p_desc+{off}];")));
            assert!(ptx.contains(&format!("ld.global.u64 %rd{reg}, [%rd40+{off}];")));
        }
        assert_eq!(ptx.matches("COMMIT_DONE:").count(), 2, "both entries carry the body");
    }

    #[test]
    fn a_ring_replays_while_its_commits_come_on_average_within_the_bound() {
        use std::time::Duration;
        let ms = Duration::from_millis;
        assert_eq!(CommitGraph::default(), CommitGraph::Within(COMMIT_GRAPH_WITHIN));
        let w = COMMIT_GRAPH_WITHIN;
        let run = |intervals: &[Option<Duration>]| {
            let mut p = Pace::default();
            intervals.iter().map(|&i| p.next(w, i)).collect::<Vec<bool>>()
        };
        // A frame every 2 ms: the first launches, every other replays.
        let fast = [None, Some(ms(2)), Some(ms(2)), Some(ms(2))];
        assert_eq!(run(&fast), [false, true, true, true]);
        // 25 fps never replays.
        assert_eq!(run(&[None, Some(ms(40)), Some(ms(40))]), [false; 3]);
        // Jitter around the bound, within one and a half times it: once
        // replaying, the ring keeps replaying.
        let jitter = [
            Some(ms(3)),
            Some(ms(5)),
            Some(ms(5)),
            Some(ms(5)),
            Some(ms(5)),
            Some(ms(5)),
        ];
        assert!(run(&jitter).iter().all(|&r| r), "{:?}", run(&jitter));
        // Above the bound on average but never past 1.5×: it never starts.
        let slow = [Some(ms(5)), Some(ms(5)), Some(ms(3)), Some(ms(5)), Some(ms(5))];
        assert!(run(&slow).iter().all(|&r| !r), "{:?}", run(&slow));
        // A pause stops it at once, and it starts again only once the
        // average has come down within the bound.
        let mut p = Pace::default();
        assert!(!p.next(w, None));
        assert!(p.next(w, Some(ms(1))));
        assert!(
            !p.next(w, Some(w + w / 2 + Duration::from_nanos(1))),
            "a pause launches"
        );
        let after: Vec<bool> = (0..12).map(|_| p.next(w, Some(ms(1)))).collect();
        let first = after.iter().position(|&r| r).expect("replays again at a fast pace");
        assert!(first > 0, "the average had to come down first: {after:?}");
        assert!(after[first..].iter().all(|&r| r), "{after:?}");
    }

    #[test]
    fn the_fetch_kernel_walks_the_ring_the_publisher_writes() {
        let ptx = ptx().into_string().unwrap();
        let fetch = &ptx[ptx.find(FETCH_KERNEL).unwrap()..];
        assert_eq!(RING_ENTRIES, 64);
        assert!(
            fetch.contains("and.b64 %rd4, %rd3, 63;"),
            "entry = count % RING_ENTRIES"
        );
        assert!(
            fetch.contains(&format!(
                "mul.lo.u64 %rd4, %rd4, {};",
                std::mem::size_of::<CommitDesc>()
            )),
            "entries are one descriptor apart"
        );
        assert!(
            fetch.contains(&format!("add.u64 %rd9, %rd2, {STATE_DESC};")),
            "the state's descriptor"
        );
        assert_eq!(
            STATE_DESC as usize + std::mem::size_of::<CommitDesc>(),
            STATE_BYTES as usize
        );
        // 12 threads of 16 bytes move one descriptor.
        assert!(fetch.contains("setp.ge.u32 %p1, %r1, 12;"));
        assert_eq!(12 * 16, std::mem::size_of::<CommitDesc>());
        assert!(ptx.contains(".visible .entry vramring_commit_fetch("));
    }
}
