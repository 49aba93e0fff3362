//! The subscriber table: the one writer of every subscriber entry, for both
//! ring kinds.
//!
//! # Lifecycle of an entry
//!
//! ```text
//!            assign (service)                 evict (producer: lease, or
//!   FREE ───────────────────────▶ ACTIVE ──── service: protocol) ───▶ EVICTED
//!    ▲    generation += 1,          │                                    │
//!    │    new client region         │ free (service: EOF, Bye, close)    │ free / reap
//!    └──────────────────────────────┴────────────────────────────────────┘
//! ```
//!
//! * The table ([`SubEntry`]s) is written by this module alone, on the
//!   publisher's threads: the socket service assigns and frees, the
//!   producer evicts (a compare-exchange, so a racing free wins cleanly) and
//!   mirrors. Subscribers map it read-only: the memfd is sealed
//!   `F_SEAL_FUTURE_WRITE` once the publisher has mapped it, and what they
//!   receive is a read-only reopen.
//! * What a subscriber writes lives in its **client region** ([`ClientLine`]),
//!   a memfd made for that one connection and dropped with it. No other
//!   subscriber ever holds it, so whatever a subscriber writes reaches the
//!   publisher and itself only. A reused entry gets a new region: a
//!   departed subscriber that kept its mapping writes into memory nobody
//!   reads any more.
//! * Every word the publisher reads from a client region is hostile: the
//!   lossless cursor is clamped to what was published and never moves back
//!   ([`Table::holder`]); `parked` only costs that subscriber's own wakeup;
//!   `push_held` is compared, never used as an index; counters are copied
//!   for inspection only.
//! * Liveness and eviction are decided from the table alone: a subscriber's
//!   lease holds while its entry is `ACTIVE` with its Welcome's generation.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::error::{Error, Result};
use crate::layout::{
    self, ClientLine, SubEntry, SubsHeader, CLIENT_BYTES, SUBF_LOSSLESS, SUB_ACTIVE, SUB_EVICTED, SUB_FREE,
};
use crate::shm::{Region, SEALS_FIXED_SIZE, SEALS_READ_ONLY};
use crate::sync::atomic::{AtomicUsize, Ordering};
use crate::sync::Mutex;
use crate::time::monotonic_ns;

/// What the publisher keeps of one connected subscriber.
#[derive(Debug)]
struct Client {
    /// The entry's generation this client was assigned with.
    generation: u32,
    /// The client region, mapped read-write.
    region: Region,
    /// The publisher's view of the lossless cursor (clamped, monotonic).
    released: u64,
    /// The peer's uid (`SO_PEERCRED`).
    uid: u32,
}

impl Client {
    fn line(&self) -> &ClientLine {
        self.region.at::<ClientLine>(0)
    }
}

/// An entry just assigned by [`Table::assign`].
#[derive(Debug)]
pub(crate) struct Assigned {
    /// Table index.
    pub(crate) index: u32,
    /// The entry's new generation.
    pub(crate) generation: u32,
    /// The client region's descriptor, for the Welcome (read-write: the
    /// subscriber writes its cursor there).
    pub(crate) client_fd: OwnedFd,
}

/// A lossless subscriber the producer has to wait for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Blocker {
    /// Table index.
    pub(crate) index: usize,
    /// The entry's generation.
    pub(crate) generation: u32,
    /// Its clamped lossless cursor.
    pub(crate) released: u64,
    /// The peer's uid (`SO_PEERCRED`), for the lossless back-off.
    pub(crate) uid: u32,
}

/// The subscriber table and the publisher's private side of each entry.
#[derive(Debug)]
pub(crate) struct Table {
    region: Region,
    /// Read-only reopen of the sealed table memfd, sent in every Welcome.
    send_fd: OwnedFd,
    clients: Box<[Mutex<Option<Client>>]>,
    /// One past the highest index ever assigned (process-private). Entries
    /// are taken lowest-free-first, so the producer's per-frame scans
    /// ([`Table::wake_parked`], [`Table::holder`])
    /// read as many entries as subscribers ever connected at once, not the
    /// whole table (64 entries, 64 cache lines, by default).
    high_water: AtomicUsize,
}

impl Table {
    /// A table of `max` free entries for the publisher instance `epoch`,
    /// sealed read-only for everyone but this mapping.
    ///
    /// # Errors
    /// [`Error::Io`] from memfd creation, sealing or the read-only reopen.
    pub(crate) fn create(name: &str, max: u32, epoch: u64) -> Result<Table> {
        let (region, fd) = Region::create(name, layout::subs_bytes(max))?;
        #[cfg(loom)]
        loom_construct_table(&region, max);
        region.at::<SubsHeader>(0).init(max, epoch);
        // Our mapping is made; from now on nobody can make a writable one.
        Region::seal(fd.as_fd(), SEALS_READ_ONLY)?;
        let send_fd = Region::reopen_read_only(fd.as_fd())?;
        let clients = (0..max).map(|_| Mutex::new(None)).collect();
        Ok(Table {
            region,
            send_fd,
            clients,
            high_water: AtomicUsize::new(0),
        })
    }

    /// The descriptor subscribers receive (read-only, sealed).
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.send_fd.as_fd()
    }

    /// Bytes of the table memfd.
    pub(crate) fn bytes(&self) -> u64 {
        self.region.len() as u64
    }

    /// The entries an active subscriber may hold: those below the high
    /// water mark.
    fn used(&self) -> &[SubEntry] {
        let all = self.entries();
        // SYNC: sub-state — Relaxed: `assign` raises the mark before its
        // Release store of ACTIVE and its SeqCst fence, and every scan that
        // must not miss a new entry runs after the producer's SeqCst fence,
        // so the fences' order gives the mark as they give the state (see
        // `assign`).
        let n = self.high_water.load(Ordering::Relaxed);
        &all[..n.min(all.len())]
    }

    /// Every entry.
    pub(crate) fn entries(&self) -> &[SubEntry] {
        self.region
            .slice::<SubEntry>(std::mem::size_of::<SubsHeader>(), self.clients.len())
    }

    /// Entry `index`, if in range.
    pub(crate) fn entry(&self, index: usize) -> Option<&SubEntry> {
        self.entries().get(index)
    }

    /// Entries in use now.
    pub(crate) fn active(&self) -> u32 {
        // Relaxed: a count for stats.
        self.entries()
            .iter()
            .filter(|e| e.state.load(Ordering::Relaxed) == SUB_ACTIVE)
            .count() as u32
    }

    /// Entries held now by peers with `uid`.
    pub(crate) fn held_by(&self, uid: u32) -> u32 {
        (0..self.clients.len())
            .filter(|&k| self.lock(k).as_ref().is_some_and(|c| c.uid == uid))
            .count() as u32
    }

    /// Whether entry `index` is active with `generation`.
    pub(crate) fn live(&self, index: usize, generation: u32) -> bool {
        self.entry(index).is_some_and(|e| {
            // SYNC: sub-state — Acquire pairs with the Release in `assign`.
            e.state.load(Ordering::Acquire) == SUB_ACTIVE && e.generation.load(Ordering::Relaxed) == generation
        })
    }

    /// Service: takes a free entry for a new subscriber with `SUBF_*`
    /// `flags`, `name` and peer `uid`, whose lossless cursor starts at
    /// `start()` (the ring's newest seq, or the packet before its newest
    /// keyframe), and makes its client region. `Ok(None)` when the table is
    /// full.
    ///
    /// `start` is read again once the entry is `ACTIVE`: a producer that
    /// published while the entry was being set up did not wait for it, so
    /// the cursor moves up to what was published meanwhile (the SeqCst
    /// fence below pairs with the one after the producer's seq store:
    /// either the producer sees the entry, or this reload sees its seq).
    ///
    /// # Errors
    /// [`Error::Io`] when the client region cannot be made.
    pub(crate) fn assign(&self, flags: u32, name: &str, start: &dyn Fn() -> u64, uid: u32) -> Result<Option<Assigned>> {
        let first = start();
        // Relaxed: only the service thread moves an entry out of FREE.
        let Some(index) = self
            .entries()
            .iter()
            .position(|e| e.state.load(Ordering::Relaxed) == SUB_FREE)
        else {
            return Ok(None);
        };
        let (region, fd) = Region::create("vramring-client", CLIENT_BYTES)?;
        Region::seal(fd.as_fd(), SEALS_FIXED_SIZE)?;
        #[cfg(loom)]
        loom_construct_client(&region);
        let line = region.at::<ClientLine>(0);
        // Relaxed: the region is not shared yet; the Welcome's sendmsg
        // publishes it.
        line.released_seq.store(first, Ordering::Relaxed);
        // SYNC: sub-state — raised before the Release store of ACTIVE below
        // and the SeqCst fence after it (see `used`).
        self.high_water.fetch_max(index + 1, Ordering::Relaxed);
        let e = &self.entries()[index];
        // Relaxed: all published by the Release store of `state` below.
        let generation = e.generation.load(Ordering::Relaxed).wrapping_add(1);
        e.generation.store(generation, Ordering::Relaxed);
        e.flags.store(flags, Ordering::Relaxed);
        e.push_count.store(0, Ordering::Relaxed);
        e.evict_code.store(0, Ordering::Relaxed);
        e.released_seq.store(first, Ordering::Relaxed);
        for w in [&e.delivered, &e.dropped, &e.overruns] {
            w.store(0, Ordering::Relaxed);
        }
        for w in &e.push_seq {
            w.store(0, Ordering::Relaxed);
        }
        e.heartbeat_ns.store(monotonic_ns(), Ordering::Relaxed);
        e.set_name(name);
        *self.lock(index) = Some(Client {
            generation,
            region,
            released: first,
            uid,
        });
        // SYNC: sub-state — Release, paired with the producer's Acquire when
        // it scans the table and the subscriber's Acquire at connect.
        e.state.store(SUB_ACTIVE, Ordering::Release);
        // SYNC: park-style Dekker with the producer's `publish_seq` fence
        // (see the doc above).
        crate::sync::atomic::fence(Ordering::SeqCst);
        let later = start();
        if later > first {
            if let Some(c) = self.lock(index).as_mut() {
                c.released = later;
                // Relaxed: the client region is not shared yet (the Welcome
                // publishes it); the mirror is informational.
                c.line().released_seq.store(later, Ordering::Relaxed);
                e.released_seq.store(later, Ordering::Relaxed);
            }
        }
        Ok(Some(Assigned {
            index: index as u32,
            generation,
            client_fd: fd,
        }))
    }

    /// Service: the connection of entry `index` is gone (EOF, Bye, close,
    /// eviction sent): frees the entry and drops its client region.
    pub(crate) fn free(&self, index: u32) {
        let Some(e) = self.entry(index as usize) else {
            return;
        };
        // Under the entry's lock, so an `evict` (which checks the client's
        // generation and swaps the state under the same lock) is wholly
        // before or after the free.
        let mut guard = self.lock(index as usize);
        *guard = None;
        // Relaxed: published by the Release store of `state`.
        e.flags.store(0, Ordering::Relaxed);
        e.push_count.store(0, Ordering::Relaxed);
        // SYNC: sub-state — Release; the producer stops waiting for this
        // entry and unmaps its push buffers at its next publish.
        e.state.store(SUB_FREE, Ordering::Release);
        drop(guard);
    }

    /// Marks entry `index` (if still `generation`) evicted with `EVICT_*`
    /// `code`; returns whether it was. The caller then has the service send
    /// the notice and [`Table::free`] the entry.
    pub(crate) fn evict(&self, index: usize, generation: u32, code: u32) -> bool {
        let Some(e) = self.entry(index) else {
            return false;
        };
        // The generation check and the compare-exchange under the entry's
        // lock: a free and a reassignment (both take it) cannot come between
        // them. Checked apart, a free + assign in between made the stale
        // generation's CAS find the newcomer ACTIVE and evict it (ABA;
        // tests/loom_table.rs keeps that variant as a mutant).
        let guard = self.lock(index);
        if guard.as_ref().is_none_or(|c| c.generation != generation) {
            return false;
        }
        e.evict_code.store(code, Ordering::Relaxed);
        // SYNC: sub-state — Release on success; the subscriber sees EVICTED
        // with Acquire. Fails if the service freed the entry meanwhile.
        let evicted = e
            .state
            .compare_exchange(SUB_ACTIVE, SUB_EVICTED, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok();
        drop(guard);
        evicted
    }

    /// Service: frees an entry still `EVICTED` with `generation` once its
    /// eviction request was handled. Defensive: every connection that ends
    /// is freed (`free` clears an `EVICTED` entry too), so this finds
    /// nothing to do; it keeps an eviction from ever leaving an entry
    /// `EVICTED` for good.
    pub(crate) fn reap(&self, index: u32, generation: u32) {
        if let Some(e) = self.entry(index as usize) {
            // Relaxed: only publisher threads write these; the free's
            // Release store publishes the change.
            if e.state.load(Ordering::Relaxed) == SUB_EVICTED && e.generation.load(Ordering::Relaxed) == generation {
                self.free(index);
            }
        }
    }

    /// Runs `f` on the entry and client region of `index` while it is
    /// assigned with `generation` (the region stays mapped meanwhile).
    pub(crate) fn with_client<R>(
        &self,
        index: usize,
        generation: u32,
        f: impl FnOnce(&SubEntry, &ClientLine) -> R,
    ) -> Option<R> {
        let e = self.entry(index)?;
        let guard = self.lock(index);
        let c = guard.as_ref().filter(|c| c.generation == generation)?;
        Some(f(e, c.line()))
    }

    /// Producer, as it takes a push subscriber's buffers: runs `f` on the
    /// entry (which stores `push_count`) while it is assigned with
    /// `generation`, and starts a lossless reader's cursor at `newest`:
    /// frames published before its buffers were mapped never reach it, so
    /// the producer does not wait for them.
    pub(crate) fn start_push<R>(
        &self,
        index: usize,
        generation: u32,
        newest: u64,
        f: impl FnOnce(&SubEntry) -> R,
    ) -> Option<R> {
        let e = self.entry(index)?;
        let mut guard = self.lock(index);
        let c = guard.as_mut().filter(|c| c.generation == generation)?;
        c.released = c.released.max(newest);
        // Relaxed: informational mirror, single writer (the producer).
        e.released_seq.store(c.released, Ordering::Relaxed);
        Some(f(e))
    }

    /// The publisher's read-write mapping of the table (base, bytes), for
    /// the GPU's stream-order commit stores into `push_seq`.
    pub(crate) fn mapping(&self) -> (*mut u8, usize) {
        (self.region.as_ptr(), self.region.len())
    }

    /// Producer, after its seq store (CPU commit) or its `pending_seq`
    /// store (stream-order commit: rung at the announcement, so that the
    /// producer never waits for the GPU, ADR 0017) and `SeqCst` fence: rings
    /// the doorbell of every subscriber whose `parked` is set.
    pub(crate) fn wake_parked(&self) {
        for (k, e) in self.used().iter().enumerate() {
            // Relaxed: a FREE entry has no region to ring; ACTIVE is
            // re-checked under the lock (the region lives as long as it).
            if e.state.load(Ordering::Relaxed) != SUB_ACTIVE {
                continue;
            }
            if let Some(c) = self.lock(k).as_ref() {
                crate::ring::wake_if_parked(c.line());
            }
        }
    }

    /// Producer: the first active lossless subscriber (lowest index) whose
    /// clamped cursor `blocks` the write, reading every cursor as hostile: a value is
    /// capped at `newest` (nothing beyond what was published can be
    /// released) and never moves the publisher's view back.
    pub(crate) fn holder(&self, newest: u64, blocks: impl Fn(u64) -> bool) -> Option<Blocker> {
        self.holder_by(newest, |_, released| blocks(released))
    }

    /// Every active lossless reader with its clamped cursor (advanced as
    /// [`Table::holder`] advances it, to at most `newest`), for the gate's
    /// per-peer sweep at a deadline.
    pub(crate) fn lossless_readers(&self, newest: u64) -> Vec<Blocker> {
        let mut readers = Vec::new();
        self.scan_lossless(newest, |_, r| {
            readers.push(r);
            false
        });
        readers
    }

    /// [`Table::holder`], where whether a reader blocks depends on its
    /// entry too (a push reader's window is its queue, not the ring).
    pub(crate) fn holder_by(&self, newest: u64, blocks: impl Fn(&SubEntry, u64) -> bool) -> Option<Blocker> {
        self.scan_lossless(newest, |e, r| blocks(e, r.released))
    }

    /// One pass over the active lossless readers: advances each one's
    /// clamped cursor (to at most `newest`, never back), and returns the
    /// first for which `stop` says so.
    fn scan_lossless(&self, newest: u64, mut stop: impl FnMut(&SubEntry, Blocker) -> bool) -> Option<Blocker> {
        for (k, e) in self.used().iter().enumerate() {
            // SYNC: sub-state — Acquire pairs with the Release in `assign`.
            if e.state.load(Ordering::Acquire) != SUB_ACTIVE || e.flags.load(Ordering::Relaxed) & SUBF_LOSSLESS == 0 {
                continue;
            }
            let mut guard = self.lock(k);
            let Some(c) = guard.as_mut() else { continue };
            // SYNC: release-cursor — Acquire pairs with the subscriber's
            // Release after its copy: its reads happen before our overwrite.
            let claimed = c.line().released_seq.load(Ordering::Acquire);
            c.released = c.released.max(claimed.min(newest));
            // Relaxed: informational mirror, single writer (the producer).
            e.released_seq.store(c.released, Ordering::Relaxed);
            let r = Blocker {
                index: k,
                generation: c.generation,
                released: c.released,
                uid: c.uid,
            };
            if stop(e, r) {
                return Some(r);
            }
        }
        None
    }

    /// Service tick: copies each client's counters into its entry, for
    /// inspection tools (values are the subscriber's own claims), and
    /// advances the publisher's view of a lossless cursor as
    /// [`Table::holder`] does (clamped to `newest`, never back).
    pub(crate) fn mirror_counters(&self, newest: u64) {
        for (k, e) in self.used().iter().enumerate() {
            // Relaxed: informational.
            if e.state.load(Ordering::Relaxed) != SUB_ACTIVE {
                continue;
            }
            if let Some(c) = self.lock(k).as_mut() {
                if e.flags.load(Ordering::Relaxed) & SUBF_LOSSLESS != 0 {
                    // Relaxed: a mirror for inspection; the producer's own
                    // check (`holder`) does the Acquire load it relies on.
                    let claimed = c.line().released_seq.load(Ordering::Relaxed);
                    c.released = c.released.max(claimed.min(newest));
                    e.released_seq.store(c.released, Ordering::Relaxed);
                }
                let l = c.line();
                // Relaxed: informational copies, single writer (the service).
                for (to, from) in [
                    (&e.delivered, &l.delivered),
                    (&e.dropped, &l.dropped),
                    (&e.overruns, &l.overruns),
                    (&e.heartbeat_ns, &l.heartbeat_ns),
                ] {
                    to.store(from.load(Ordering::Relaxed), Ordering::Relaxed);
                }
            }
        }
    }

    fn lock(&self, index: usize) -> crate::sync::MutexGuard<'_, Option<Client>> {
        // A poisoned slot only means a panic elsewhere while it was held;
        // its content is still a consistent Option.
        match self.clients[index].lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }
}

/// A subscriber-side check of a peer's subscriber table.
///
/// # Errors
/// [`Error::LayoutMismatch`] when the Welcome's index is out of range.
pub(crate) fn check_index(index: u32, max: u32) -> Result<usize> {
    if index >= max {
        return Err(Error::LayoutMismatch(format!(
            "subscriber index {index} out of range (table of {max})"
        )));
    }
    Ok(index as usize)
}

/// Under loom the shared structs' atomics are modelled objects that must be
/// constructed before use: builds the table head and every entry in place.
#[cfg(loom)]
fn loom_construct_table(region: &Region, max: u32) {
    let head = std::mem::size_of::<SubsHeader>();
    let entry = std::mem::size_of::<SubEntry>();
    assert!(region.len() >= head + max as usize * entry, "table region too small");
    // SAFETY: the region was just created read-write with
    // `layout::subs_bytes(max)` bytes (checked above), page-aligned, so the
    // head at 0 and the `max` entries after it are in bounds and aligned;
    // nothing else refers to it yet.
    unsafe {
        region.as_ptr().cast::<SubsHeader>().write(SubsHeader::default());
        for k in 0..max as usize {
            region
                .as_ptr()
                .wrapping_add(head + k * entry)
                .cast::<SubEntry>()
                .write(SubEntry::default());
        }
    }
}

/// Under loom: builds a new client region's [`ClientLine`] in place.
#[cfg(loom)]
fn loom_construct_client(region: &Region) {
    assert!(
        region.len() >= std::mem::size_of::<ClientLine>(),
        "client region too small"
    );
    // SAFETY: the region was just created read-write with `CLIENT_BYTES`
    // bytes (checked above), page-aligned; nothing else refers to it yet.
    unsafe { region.as_ptr().cast::<ClientLine>().write(ClientLine::default()) }
}

/// The table's API as `tests/loom_table.rs` drives it, under `--cfg loom`
/// only: thin wrappers over [`Table`], so the model runs the table's own
/// code. Not part of the crate's API.
#[cfg(loom)]
#[doc(hidden)]
pub mod loom_api {
    use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

    use crate::layout::{self, ClientLine, SubEntry, SubsHeader, CLIENT_BYTES};
    use crate::shm::Region;

    /// A [`super::Table`].
    #[derive(Debug)]
    pub struct LoomTable(super::Table);

    /// What [`LoomTable::assign`] hands the service.
    #[derive(Debug)]
    pub struct Assigned {
        /// Table index.
        pub index: u32,
        /// The entry's new generation.
        pub generation: u32,
        /// The client region (read-write), as the Welcome carries it.
        pub client_fd: OwnedFd,
    }

    /// What [`LoomTable::holder`] reports.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Blocker {
        /// Table index.
        pub index: usize,
        /// The entry's generation.
        pub generation: u32,
        /// Its clamped lossless cursor.
        pub released: u64,
    }

    /// A subscriber's mapping of a region it received.
    #[derive(Debug)]
    pub struct Mapped(Region);

    impl Mapped {
        /// A subscriber's read-only mapping of the table `fd` of `max` entries.
        pub fn table(fd: BorrowedFd<'_>, max: u32) -> Mapped {
            Mapped(Region::map(fd, layout::subs_bytes(max), false).expect("map the table read-only"))
        }

        /// A subscriber's read-write mapping of its client region `fd`.
        pub fn client(fd: BorrowedFd<'_>) -> Mapped {
            Mapped(Region::map(fd, CLIENT_BYTES, true).expect("map the client region"))
        }

        /// Entry `index` of a mapped table.
        pub fn entry(&self, index: usize) -> &SubEntry {
            &self.0.slice::<SubEntry>(std::mem::size_of::<SubsHeader>(), index + 1)[index]
        }

        /// The line of a mapped client region.
        pub fn line(&self) -> &ClientLine {
            self.0.at::<ClientLine>(0)
        }
    }

    impl LoomTable {
        /// [`super::Table::create`].
        pub fn create(max: u32) -> LoomTable {
            LoomTable(super::Table::create("loom-table", max, 1).expect("create the table"))
        }
        /// The read-only descriptor subscribers receive.
        pub fn fd(&self) -> BorrowedFd<'_> {
            self.0.fd()
        }
        /// [`super::Table::entry`] (the publisher's own mapping).
        pub fn entry(&self, index: usize) -> &SubEntry {
            self.0.entry(index).expect("index in range")
        }
        /// [`super::Table::live`].
        pub fn live(&self, index: usize, generation: u32) -> bool {
            self.0.live(index, generation)
        }
        /// [`super::Table::assign`].
        pub fn assign(&self, flags: u32, start: u64) -> Option<Assigned> {
            self.0
                .assign(flags, "loom", &|| start, 0)
                .expect("make a client region")
                .map(|a| Assigned {
                    index: a.index,
                    generation: a.generation,
                    client_fd: a.client_fd,
                })
        }
        /// [`super::Table::free`].
        pub fn free(&self, index: u32) {
            self.0.free(index);
        }
        /// [`super::Table::evict`].
        pub fn evict(&self, index: usize, generation: u32, code: u32) -> bool {
            self.0.evict(index, generation, code)
        }
        /// [`super::Table::reap`].
        pub fn reap(&self, index: u32, generation: u32) {
            self.0.reap(index, generation);
        }
        /// [`super::Table::with_client`].
        pub fn with_client<R>(
            &self,
            index: usize,
            generation: u32,
            f: impl FnOnce(&SubEntry, &ClientLine) -> R,
        ) -> Option<R> {
            self.0.with_client(index, generation, f)
        }
        /// [`super::Table::wake_parked`].
        pub fn wake_parked(&self) {
            self.0.wake_parked();
        }
        /// [`super::Table::holder`].
        pub fn holder(&self, newest: u64, blocks: impl Fn(u64) -> bool) -> Option<Blocker> {
            self.0.holder(newest, blocks).map(|b| Blocker {
                index: b.index,
                generation: b.generation,
                released: b.released,
            })
        }
    }

    /// The client region's descriptor.
    impl AsFd for Assigned {
        fn as_fd(&self) -> BorrowedFd<'_> {
            self.client_fd.as_fd()
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The producer's scans stop at the high water mark, which never moves
    /// down: a subscriber above entries freed since is still found.
    #[test]
    fn scans_reach_an_active_entry_above_freed_ones() {
        let t = Table::create("vramring-test-table", 8, 1).expect("table");
        let assigned: Vec<Assigned> = (0..3)
            .map(|_| {
                t.assign(SUBF_LOSSLESS, "s", &|| 0, 0)
                    .expect("client region")
                    .expect("free entry")
            })
            .collect();
        assert_eq!(assigned[2].index, 2, "entries are taken lowest-free-first");
        assert_eq!(t.used().len(), 3, "only entries ever assigned are scanned");
        t.free(0);
        t.free(1);
        assert_eq!(t.used().len(), 3, "the mark does not move down");
        let bell = |t: &Table| {
            t.with_client(2, assigned[2].generation, |_, c| c.doorbell.load(Ordering::Relaxed))
                .expect("entry 2 is live")
        };
        t.wake_parked();
        assert_eq!(bell(&t), 0, "an unparked subscriber is not rung");
        t.with_client(2, assigned[2].generation, |_, c| c.parked.store(1, Ordering::Relaxed))
            .expect("entry 2 is live");
        t.wake_parked();
        assert_eq!(bell(&t), 1, "a parked subscriber above freed entries is rung");
        let b = t.holder(5, |_| true).expect("entry 2 holds the writer");
        assert_eq!(b.index, 2);
        // A newcomer reuses the lowest free entry: the mark stays.
        let again = t.assign(0, "s", &|| 0, 0).expect("region").expect("free entry");
        assert_eq!(again.index, 0);
        assert_eq!(t.used().len(), 3);
    }
}
