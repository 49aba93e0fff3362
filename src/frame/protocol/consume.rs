//! The subscriber's half: pick the seq to read, snapshot the slot's meta,
//! and validate after the copy.

use crate::layout::{SlotDesc, SEQ_WRITING, USER_META_WORDS};
use crate::sync::atomic::{fence, Ordering};

/// Which frames a subscriber wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Jump to the newest frame.
    Latest,
    /// Every frame in order; gaps reported.
    Sequential,
}

/// The seq to read next and how many frames are skipped to get there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pick {
    /// Seq to read.
    pub seq: u64,
    /// Frames between the last one delivered and `seq` that will never be
    /// delivered.
    pub skipped: u64,
}

/// The newest frames a reader may still find intact, for a ring of
/// `slot_count` slots: `slot_count - 1`, since the slot after the newest may
/// already be being overwritten. A lossless reader's frames are held for it,
/// so its window is unbounded.
pub fn safe_window(slot_count: u32, lossless: bool) -> u64 {
    if lossless {
        u64::MAX
    } else {
        u64::from(slot_count.max(2)) - 1
    }
}

/// Chooses the next seq, given the last one delivered (or the start cursor),
/// the newest published seq, and the [`safe_window`]. `None` when there is
/// nothing new.
///
/// In `Sequential` mode a reader that fell more than `window` frames behind
/// jumps to the oldest frame still in the window.
pub fn pick(mode: Mode, last: u64, global: u64, window: u64) -> Option<Pick> {
    if global <= last {
        return None;
    }
    match mode {
        Mode::Latest => Some(Pick {
            seq: global,
            skipped: global - last - 1,
        }),
        Mode::Sequential => {
            let want = last + 1;
            let oldest = global.saturating_sub(window.max(1) - 1).max(1);
            if want < oldest {
                Some(Pick {
                    seq: oldest,
                    skipped: oldest - want,
                })
            } else {
                Some(Pick { seq: want, skipped: 0 })
            }
        }
    }
}

/// What a reader saw in a slot's descriptor, before its copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotSnapshot {
    /// The seq the slot held, equal to the wanted seq.
    pub seq: u64,
    /// Presentation timestamp.
    pub pts: i64,
    /// `CLOCK_MONOTONIC` ns of the commit.
    pub commit_ns: u64,
    /// Flags.
    pub flags: u32,
    /// User metadata bytes in use (clamped to the area).
    pub user_len: u32,
    /// User metadata.
    pub user: [u64; USER_META_WORDS],
}

/// What [`SlotSnapshot::look`] finds in a slot.
pub type Look = crate::ring::Look<SlotSnapshot>;

impl SlotSnapshot {
    /// The user metadata bytes in use.
    pub fn user_bytes(&self) -> Vec<u8> {
        let mut out: Vec<u8> = self.user.iter().flat_map(|w| w.to_le_bytes()).collect();
        out.truncate(self.user_len as usize);
        out
    }

    /// Reads the slot's seq (Acquire) and, if it is `want`, its meta.
    pub fn look(slot: &SlotDesc, want: u64) -> Look {
        // SYNC: slot-seq — Acquire pairs with the publisher's Release commit.
        let s = slot.seq.load(Ordering::Acquire);
        if s != want {
            return if s & SEQ_WRITING != 0 || s > want {
                Look::Overwritten
            } else {
                Look::NotYet
            };
        }
        // Relaxed: guarded by the seqlock; the caller must call
        // `still_valid` before trusting any of these.
        let mut user = [0u64; USER_META_WORDS];
        for (d, w) in user.iter_mut().zip(slot.user.iter()) {
            *d = w.load(Ordering::Relaxed);
        }
        Look::Ready(SlotSnapshot {
            seq: want,
            pts: slot.pts.load(Ordering::Relaxed) as i64,
            commit_ns: slot.commit_ns.load(Ordering::Relaxed),
            flags: slot.flags.load(Ordering::Relaxed),
            user_len: slot.user_len.load(Ordering::Relaxed).min((USER_META_WORDS * 8) as u32),
            user,
        })
    }

    /// After the copy (and its completion): whether the slot still holds
    /// this frame, i.e. nothing the reader copied can come from a later write.
    pub fn still_valid(&self, slot: &SlotDesc) -> bool {
        // SYNC: invalidate — Acquire fence pairs with the publisher's SeqCst
        // fence after its invalidating store: if the copy observed any write
        // made after that fence, this reload observes the invalidation.
        fence(Ordering::Acquire);
        slot.seq.load(Ordering::Relaxed) == self.seq
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latest_jumps_to_newest_and_counts_the_gap() {
        assert_eq!(pick(Mode::Latest, 3, 10, 7), Some(Pick { seq: 10, skipped: 6 }));
        assert_eq!(pick(Mode::Latest, 10, 10, 7), None);
    }

    #[test]
    fn sequential_reads_in_order_until_it_falls_out_of_the_ring() {
        let w = safe_window(8, false);
        assert_eq!(pick(Mode::Sequential, 3, 5, w), Some(Pick { seq: 4, skipped: 0 }));
        // 8 slots: frames 100-6..=100 are safe to read; 94 is the oldest.
        assert_eq!(pick(Mode::Sequential, 10, 100, w), Some(Pick { seq: 94, skipped: 83 }));
        assert_eq!(
            pick(Mode::Sequential, 0, 1, safe_window(2, false)),
            Some(Pick { seq: 1, skipped: 0 })
        );
    }

    #[test]
    fn a_lossless_reader_never_skips() {
        let w = safe_window(2, true);
        assert_eq!(pick(Mode::Sequential, 10, 100, w), Some(Pick { seq: 11, skipped: 0 }));
    }
}
