//! PROTOCOL.md's push-delivery claim, complete and take (section 16.5),
//! latest and queued, against `vramring::seam::protocol::push`.

use std::fmt::Write as _;
use std::sync::atomic::Ordering;

use vramring::seam::layout::{self, ClientLine, SubEntry};
use vramring::seam::protocol::push;

use super::{doc_c_block, Checks};

/// A zeroed subscriber-table entry with these push words, and a zeroed
/// client region with this hold.
fn push_entry(push_seq: &[u64], held: u32) -> (Box<SubEntry>, Box<ClientLine>) {
    // SAFETY: `SubEntry` is made of atomic integers only, for which all-zero
    // bytes are a valid value.
    let e: Box<SubEntry> = Box::new(unsafe { std::mem::zeroed() });
    // SAFETY: as above, for `ClientLine`.
    let cl: Box<ClientLine> = Box::new(unsafe { std::mem::zeroed() });
    for (w, &v) in e.push_seq.iter().zip(push_seq) {
        w.store(v, Ordering::Relaxed);
    }
    cl.push_held.store(held, Ordering::Relaxed);
    (e, cl)
}

/// Emits C statements that build a `vr_sub_entry` named `name` with these
/// push words and a `vr_client_line` named `<name>_c` with this hold.
fn c_push_entry(c: &mut Checks, name: &str, push_seq: &[u64], held: u32) {
    let _ = writeln!(
        c.prelude,
        "    vr_sub_entry {name}; memset(&{name}, 0, sizeof {name});\n\
         \x20   vr_client_line {name}_c; memset(&{name}_c, 0, sizeof {name}_c); {name}_c.push_held = {held}u;"
    );
    for (k, v) in push_seq.iter().enumerate() {
        let _ = writeln!(c.prelude, "    {name}.push_seq[{k}] = UINT64_C({v:#x});");
    }
}

/// The push-delivery C code of PROTOCOL.md section 16.5 compiles, and its
/// claim, complete and take do what `vramring::seam::protocol::push` does.
pub(super) fn protocol_md_push(c: &mut Checks, md: &str) {
    let code = doc_c_block(md, "### 16.5 The claim and hold protocol");
    let _ = writeln!(c.top, "/* PROTOCOL.md, section 16.5 */\n{code}\n");
    let w = layout::SEQ_WRITING;

    // Claim, then complete: (push_seq, held, newest, seq).
    let claims: [([u64; 3], u32, Option<usize>, u64); 6] = [
        ([0, 0, 0], 0, None, 1),
        ([5, 6, 7], 0, Some(0), 8),
        ([5, 6, 7], 2, Some(0), 8),
        ([5, 6, 7], 3, Some(1), 8),
        ([5, 6, 7], 1, None, 8),
        ([5, 6 | w, 7], 3, Some(0), 9),
    ];
    for (n, (seqs, held, newest, seq)) in claims.into_iter().enumerate() {
        let (e, cl) = push_entry(&seqs, held);
        let k = push::claim_buffer(&e, &cl, newest, seq);
        let name = format!("claim{n}");
        c_push_entry(c, &name, &seqs, held);
        let newest_c = newest.map_or(-1, |k| k as i64);
        let _ = writeln!(
            c.prelude,
            "    int {name}_k = vr_push_claim(&{name}, &{name}_c, {newest_c}, UINT64_C({seq:#x}));"
        );
        // The words right after the claim, before the C code completes it.
        let _ = writeln!(
            c.prelude,
            "    uint64_t {name}_claimed[VR_PUSH_BUFFERS]; memcpy({name}_claimed, {name}.push_seq, sizeof {name}_claimed);"
        );
        c.push(
            format!("push claim #{n} k+1"),
            format!("{name}_k + 1"),
            k.map_or(0, |k| k + 1),
        );
        for j in 0..layout::PUSH_BUFFERS {
            c.push(
                format!("push claim #{n} push_seq[{j}]"),
                format!("{name}_claimed[{j}]"),
                e.push_seq[j].load(Ordering::Relaxed),
            );
        }
        if let Some(k) = k {
            push::complete_buffer(&e, k, seq);
            let _ = writeln!(
                c.prelude,
                "    vr_push_complete(&{name}, {name}_k, UINT64_C({seq:#x}));"
            );
            c.push(
                format!("push complete #{n} push_seq[{k}]"),
                format!("{name}.push_seq[{k}]"),
                e.push_seq[k].load(Ordering::Relaxed),
            );
        }
    }
    let (e, cl) = push_entry(&[5, 6, 7], 3);
    assert_eq!(
        push::claim_buffer(&e, &cl, Some(0), 8),
        Some(1),
        "with 3 buffers, one is neither newest nor held"
    );

    // Take: (push_seq, held, after, upto: the global_seq loaded before).
    let m = u64::MAX;
    let takes: [([u64; 3], u32, u64, u64); 10] = [
        ([0, 0, 0], 0, 0, m),
        ([5, 7 | w, 6], 0, 4, m),
        ([5, 7, 6], 2, 7, m),
        ([9, 8, 10 | w], 0, 0, m),
        ([3, 4, 5], 1, 4, m),
        ([4, 4, 2], 0, 1, m),
        ([1 | w, 2 | w, 3 | w], 3, 0, m),
        // Frame 7's push word is visible, its commit has not landed: the
        // newest committed one (6) is taken, 7 waits.
        ([5, 7, 6], 0, 4, 6),
        // Nothing committed past `after`: nothing taken.
        ([5, 7, 6], 0, 6, 6),
        ([8, 7, 9], 2, 6, 7),
    ];
    for (n, (seqs, held, after, upto)) in takes.into_iter().enumerate() {
        let (e, cl) = push_entry(&seqs, held);
        let got = push::take_newest(&e, &cl, after, upto);
        // The cases with an `upto`: only committed frames are taken.
        let want = match n {
            7 => Some(Some((2, 6))),
            8 => Some(None),
            9 => Some(Some((1, 7))),
            _ => None,
        };
        if let Some(want) = want {
            assert_eq!(got, want, "take #{n}: {seqs:?} after {after} upto {upto}");
        }
        let name = format!("take{n}");
        c_push_entry(c, &name, &seqs, held);
        let _ = writeln!(
            c.prelude,
            "    uint64_t {name}_seq = 0; int {name}_k = vr_push_take(&{name}, &{name}_c, UINT64_C({after:#x}), UINT64_C({upto:#x}), &{name}_seq);"
        );
        c.push(
            format!("push take #{n} k+1"),
            format!("{name}_k + 1"),
            got.map_or(0, |(k, _)| k + 1),
        );
        c.push(
            format!("push take #{n} seq"),
            format!("{name}_seq"),
            got.map_or(0, |(_, s)| s),
        );
        c.push(
            format!("push take #{n} push_held"),
            format!("{name}_c.push_held"),
            cl.push_held.load(Ordering::Relaxed),
        );
    }
}

/// A queued-claim case: (push_seq, held, count, skip, seq, the k it must pick).
type QueuedClaim<'a> = (&'a [u64], u32, usize, u32, u64, Option<usize>);

/// The queued-push C code of PROTOCOL.md section 16.8 compiles, and its
/// claim and oldest-first take do what `claim_queued` and `take` do.
pub(super) fn protocol_md_push_queue(c: &mut Checks, md: &str) {
    let code = doc_c_block(md, "### 16.8 Queued push: sequential and lossless readers");
    let _ = writeln!(c.top, "/* PROTOCOL.md, section 16.8 */\n{code}\n");
    let w = layout::SEQ_WRITING;
    let claims: [QueuedClaim<'_>; 9] = [
        // Empty buffers: the first.
        (&[0, 0, 0, 0], 0, 4, 0, 1, Some(0)),
        // Nothing held: only an empty one, even if others are old.
        (&[3, 4, 0, 5], 0, 4, 0, 6, Some(2)),
        (&[3, 4, 5], 0, 3, 0, 6, None),
        // Held frame 5 (buffer 2): 3 and 4 are read; the oldest goes.
        (&[3, 4, 5, 6], 3, 4, 0, 7, Some(0)),
        // ... unless it is in flight.
        (&[3, 4, 5, 6], 3, 4, 1, 7, Some(1)),
        // Held frame 3: the newer ones are unread, so none is free.
        (&[3, 4, 5], 1, 3, 0, 6, None),
        // A failed copy is free; the held one never.
        (&[5 | w, 6, 7], 2, 3, 0, 8, Some(0)),
        // A hold out of range counts as none.
        (&[3, 4, 0], 9, 3, 0, 5, Some(2)),
        // A buffer past `count` is never touched.
        (&[3, 4, 5, 0], 3, 3, 0, 6, Some(0)),
    ];
    for (n, (seqs, held, count, skip, seq, want)) in claims.into_iter().enumerate() {
        let (e, cl) = push_entry(seqs, held);
        let k = push::claim_queued(&e, &cl, count, skip, seq);
        assert_eq!(k, want, "queued claim #{n}: {seqs:?} held {held}");
        let name = format!("qclaim{n}");
        c_push_entry(c, &name, seqs, held);
        let _ = writeln!(
            c.prelude,
            "    int {name}_k = vr_push_claim_queued(&{name}, &{name}_c, {count}u, {skip}u, UINT64_C({seq:#x}));"
        );
        c.push(
            format!("queued claim #{n} k+1"),
            format!("{name}_k + 1"),
            k.map_or(0, |k| k + 1),
        );
        for j in 0..seqs.len() {
            c.push(
                format!("queued claim #{n} push_seq[{j}]"),
                format!("{name}.push_seq[{j}]"),
                e.push_seq[j].load(Ordering::Relaxed),
            );
        }
    }
    // Take, oldest first: (push_seq, count, after, upto).
    let m = u64::MAX;
    let takes: [(&[u64], usize, u64, u64); 6] = [
        (&[0, 0, 0], 3, 0, m),
        (&[7, 5, 6], 3, 4, m),
        (&[7, 5, 6], 3, 5, m),
        (&[7, 5 | w, 6], 3, 4, m),
        (&[7, 5, 6], 3, 4, 4),
        (&[9, 8, 0, 3], 3, 7, m),
    ];
    for (n, (seqs, count, after, upto)) in takes.into_iter().enumerate() {
        let (e, cl) = push_entry(seqs, 0);
        let got = push::take(&e, &cl, push::Order::Oldest, count, after, upto);
        let name = format!("qtake{n}");
        c_push_entry(c, &name, seqs, 0);
        let _ = writeln!(
            c.prelude,
            "    uint64_t {name}_seq = 0; int {name}_k = vr_push_take_oldest(&{name}, &{name}_c, {count}u, UINT64_C({after:#x}), UINT64_C({upto:#x}), &{name}_seq);"
        );
        c.push(
            format!("queued take #{n} k+1"),
            format!("{name}_k + 1"),
            got.map_or(0, |(k, _)| k + 1),
        );
        c.push(
            format!("queued take #{n} seq"),
            format!("{name}_seq"),
            got.map_or(0, |(_, s)| s),
        );
        c.push(
            format!("queued take #{n} push_held"),
            format!("{name}_c.push_held"),
            cl.push_held.load(Ordering::Relaxed),
        );
    }
    let (e, cl) = push_entry(&[7, 5, 6], 0);
    assert_eq!(
        push::take(&e, &cl, push::Order::Oldest, 3, 4, m),
        Some((1, 5)),
        "the oldest frame past `after` comes first"
    );
}
