//! What a subscriber asks for (`SubscriberOptions`, `PullStart`) and what
//! it counts (`SubscriberStats`).

use super::*;

/// How to subscribe.
#[derive(Debug, Clone)]
pub struct SubscriberOptions {
    /// The settings both ring kinds share: name, handshake timeout,
    /// lossless, how to wait (builders: [`ClientOptions`]).
    pub client: ClientConfig,
    /// `Latest` (default) or `Sequential`.
    pub mode: Mode,
    /// Ask for write access to the pool (mapped read-only otherwise).
    pub write: bool,
    /// Which backends this subscriber may import (default: host and CUDA).
    pub backends: Vec<BackendKind>,
    /// How frames reach this subscriber (default [`Delivery::Auto`]: pull
    /// where the publisher hands out its pool, push where it does not).
    pub delivery: Delivery,
    /// Buffers of a sequential or lossless push subscriber's queue (default
    /// 8; at least 2, at most 16 and one more than the ring's slots): the
    /// frames the publisher may push ahead of it. A latest push subscriber
    /// always has 3.
    pub push_buffers: u32,
    /// Reconnect to the next publisher instance at the same path after the
    /// current one is gone. `next()` reports [`Error::ProducerGone`] once;
    /// later calls reconnect (within their timeout) and continue with the
    /// new instance's frames.
    pub reconnect: bool,
    /// When a pull subscriber's copy of a CUDA frame starts (see
    /// [`PullStart`]; default [`PullStart::Auto`]).
    pub pull_start: PullStart,
}

/// How frames reach a subscriber (PROTOCOL.md §11, §16).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Delivery {
    /// Pull where the publisher hands this subscriber its pool, push where
    /// it does not (a CUDA ring hands its pool only to the uids it names,
    /// by default its own). [`Subscriber::delivery`] says which was given.
    #[default]
    Auto,
    /// Pull only: the subscriber imports the pool and copies (or borrows)
    /// each frame itself; refused where the publisher does not hand out
    /// its pool.
    Pull,
    /// Push only: the publisher copies each frame, in its own GPU context,
    /// into buffers this subscriber owns (a latest reader: the newest of 3;
    /// a sequential or lossless reader: a queue of
    /// [`SubscriberOptions::push_buffers`]), so receiving a frame costs this
    /// process no GPU work. Frames published before the publisher mapped
    /// the buffers (at a publish soon after the handshake) never reach it.
    Push,
}

/// When a pull subscriber on a CUDA ring starts copying a frame (ADR 0010).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PullStart {
    /// [`PullStart::Queued`] when the GPU is shared through MPS (the
    /// device says so), [`PullStart::AfterCommit`] otherwise: without
    /// MPS a copy waiting on the GPU keeps a context of its own ready to
    /// run beside the publisher's, which costs the GPU a context switch
    /// per frame anyway.
    #[default]
    Auto,
    /// As soon as the publisher has loaned the next frame's slot (ADR
    /// 0014, on a ring with a gate line; a waiter that is spinning sees it
    /// at once, a parked one only at its next look, usually after the
    /// commit) or
    /// announced the frame (its commit is enqueued on the GPU but may not
    /// have run): the copy is enqueued behind a GPU wait on the pool's gate
    /// word (device memory, ADR 0011; on a ring without a gate line, on
    /// `global_seq` in host memory) and starts the moment the commit lands,
    /// with no CPU wake in between; the frame is then validated as always.
    /// A copy whose commit has not come by the call's deadline stays
    /// queued, and the next call resumes it. Falls back to `AfterCommit`
    /// where the device cannot wait on memory (no 64-bit stream memory
    /// operations; for the host word, no read-only host registration).
    Queued,
    /// After the commit has landed and this process has seen it: no copy
    /// waits on the GPU.
    AfterCommit,
}

impl Default for SubscriberOptions {
    fn default() -> Self {
        SubscriberOptions {
            client: ClientConfig::named("sub"),
            mode: Mode::Latest,
            write: false,
            backends: vec![BackendKind::Host, BackendKind::Cuda],
            delivery: Delivery::Auto,
            push_buffers: 8,
            reconnect: false,
            pull_start: PullStart::Auto,
        }
    }
}

impl SubscriberOptions {
    /// Sets the read mode.
    pub fn mode(mut self, m: Mode) -> Self {
        self.mode = m;
        self
    }
    /// Asks for write access.
    pub fn write(mut self, yes: bool) -> Self {
        self.write = yes;
        self
    }
    /// Restricts the backends this subscriber imports.
    pub fn backends(mut self, b: &[BackendKind]) -> Self {
        self.backends = b.to_vec();
        self
    }
    /// Sets how frames reach this subscriber.
    pub fn delivery(mut self, d: Delivery) -> Self {
        self.delivery = d;
        self
    }
    /// Push delivery only (`true`: [`Delivery::Push`]), or the automatic
    /// choice (`false`: [`Delivery::Auto`]).
    pub fn push(self, yes: bool) -> Self {
        self.delivery(if yes { Delivery::Push } else { Delivery::Auto })
    }
    /// Sets the queue of a sequential or lossless push subscriber (see
    /// [`SubscriberOptions::push_buffers`](SubscriberOptions#structfield.push_buffers)).
    pub fn push_buffers(mut self, n: u32) -> Self {
        self.push_buffers = n;
        self
    }
    /// Reconnects by itself to the next publisher instance at the same path.
    pub fn reconnect(mut self, yes: bool) -> Self {
        self.reconnect = yes;
        self
    }
    /// Sets when a pull copy of a CUDA frame starts (see [`PullStart`]).
    pub fn pull_start(mut self, p: PullStart) -> Self {
        self.pull_start = p;
        self
    }
}

impl ClientOptions for SubscriberOptions {
    fn client_mut(&mut self) -> &mut ClientConfig {
        &mut self.client
    }
    /// Asks to be lossless (implies `Sequential`).
    fn lossless(mut self, yes: bool) -> Self {
        self.client.lossless = yes;
        if yes {
            self.mode = Mode::Sequential;
        }
        self
    }
}

/// Counters of a subscriber.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SubscriberStats {
    /// Frames handed to the user.
    pub delivered: u64,
    /// Frames skipped and never delivered (gaps).
    pub dropped: u64,
    /// Reads discarded because the producer overwrote the slot during the copy.
    pub overruns: u64,
    /// Seq of the last frame delivered.
    pub last_seq: u64,
    /// Times this subscriber reconnected to a new publisher instance.
    pub reconnects: u64,
    /// How frames reach this subscriber: [`Delivery::Pull`] or
    /// [`Delivery::Push`], as the publisher granted.
    pub delivery: Delivery,
    /// Frames received by push delivery (no GPU work in this process).
    pub pushed: u64,
    /// Frames pulled by a copy queued on the GPU before their commit
    /// landed ([`PullStart::Queued`]).
    pub queued: u64,
    /// Of `queued`, the copies queued as soon as the publisher loaned the
    /// frame's slot, before it announced the commit (ADR 0014).
    pub queued_at_loan: u64,
    /// Queued copies given up on because the commit they waited for never
    /// landed: the publisher was gone (died with the frame loaned or in
    /// flight), or the subscriber closed with the copy still waiting.
    pub abandoned: u64,
}
