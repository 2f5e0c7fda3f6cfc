//! Exhaustive interleaving check of one ring's protocol (a model of
//! `devcomm_device::gin::proxy::post` and of `Rings::poll`/`complete`).
//!
//! Every thread is a state machine whose steps are single shared-memory
//! accesses; the explorer runs every interleaving (depth-first, with
//! memoised states) of a few producers and the consumer and checks that
//!
//! * a producer writes a slot only after the consumer has completed the
//!   ticket that used it before (credit);
//! * the consumer takes a slot only when every word it read was written
//!   for that ticket (the lap tags): never a torn, half-rewritten or stale
//!   body — the slot's words are written one by one, in either order, while
//!   the consumer may be reading them;
//! * per producer, descriptors arrive in order, none lost or duplicated;
//! * no interleaving deadlocks.
//!
//! Spin loops are modelled as blocking steps (enabled once their condition
//! holds), which covers every number of spins. Accesses are sequentially
//! consistent here: the memory orderings (acquire/release) are what the
//! GPU tests and the host stress tests exercise.

use devcomm_gin::slot_tag;
use std::collections::HashSet;

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Producer {
    pc: u8,
    posted: u8,
    ticket: u64,
    done: u64,
}

/// One word of a slot: (tag, value, ghost: the ticket that wrote it — not
/// visible to the consumer, only to the checks).
type Word = (u8, u8, u64);

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct State {
    head: u64,
    completed: u64,
    cache: u64,
    /// Per slot, two tagged words: (producer) and (sequence number).
    slots: Vec<[Word; 2]>,
    producers: Vec<Producer>,
    /// Consumer: pc, and the first word it read.
    cpc: u8,
    cword: Word,
    next_seq: Vec<u8>,
}

struct Model {
    depth: u64,
    each: u8,
    cached: bool,
    /// Off: producers skip the credit check (a broken protocol the
    /// explorer must reject).
    credit: bool,
    /// Off: every lap writes the same tag (a broken protocol the explorer
    /// must reject: the consumer takes half-rewritten slots).
    lap_tags: bool,
}

impl Model {
    fn total(&self, s: &State) -> u64 {
        s.producers.len() as u64 * self.each as u64
    }

    fn tag(&self, ticket: u64) -> u8 {
        if self.lap_tags {
            slot_tag(ticket, self.depth as u32)
        } else {
            0x80
        }
    }

    /// Successor states; panics on a violated property.
    fn steps(&self, s: &State) -> Vec<State> {
        let mut out = Vec::new();
        let d = self.depth;
        for i in 0..s.producers.len() {
            let p = &s.producers[i];
            if p.posted == self.each {
                continue;
            }
            let slot = (p.ticket % d) as usize;
            let tag = self.tag(p.ticket);
            let words = [(tag, i as u8, p.ticket), (tag, p.posted, p.ticket)];
            let credit = |s: &State| {
                assert!(p.ticket < s.completed + d, "slot {slot} written without credit (ticket {})", p.ticket);
            };
            // The two words become visible in either order.
            let mut branches: Vec<(usize, u8)> = Vec::new();
            let mut n = s.clone();
            let q = &mut n.producers[i];
            match p.pc {
                // ticket = fetch_add(head)
                0 => {
                    q.ticket = s.head;
                    n.head += 1;
                    q.pc = 1;
                }
                // credit from the cache (or always ask the tail)
                1 => q.pc = if !self.credit || (self.cached && p.ticket < s.cache + d) { 4 } else { 2 },
                // wait: completed (acquire) until ticket < done + depth
                2 => {
                    if p.ticket >= s.completed + d {
                        continue; // blocked
                    }
                    q.done = s.completed;
                    q.pc = 3;
                }
                3 => {
                    n.cache = p.done;
                    q.pc = 4;
                }
                // first word: 0 or 1
                4 => branches.extend([(0, 5), (1, 6)]),
                // second word, then done
                5 => branches.push((1, 7)),
                6 => branches.push((0, 7)),
                _ => unreachable!(),
            }
            if branches.is_empty() {
                out.push(n);
            }
            for (w, pc) in branches {
                credit(s);
                let mut n = s.clone();
                n.slots[slot][w] = words[w];
                let q = &mut n.producers[i];
                if pc == 7 {
                    q.posted += 1;
                    q.pc = 0;
                } else {
                    q.pc = pc;
                }
                out.push(n);
            }
        }
        if s.completed < self.total(s) {
            let slot = (s.completed % d) as usize;
            let tag = self.tag(s.completed);
            let mut n = s.clone();
            match s.cpc {
                // poll, word 0 (relaxed): wait for the ticket's tag
                0 if s.slots[slot][0].0 == tag => {
                    n.cword = s.slots[slot][0];
                    n.cpc = 1;
                }
                0 => {}
                // word 1: both tags of the ticket → the body (acquire fence), else poll again
                1 => {
                    let w1 = s.slots[slot][1];
                    if w1.0 == tag {
                        let w0 = s.cword;
                        assert_eq!((w0.2, w1.2), (s.completed, s.completed), "torn or stale slot taken");
                        let p = w0.1 as usize;
                        assert_eq!(w1.1, s.next_seq[p], "producer {p}: lost, duplicated or reordered");
                        n.next_seq[p] += 1;
                        n.cpc = 2;
                    } else {
                        let idle = s.producers.iter().all(|p| p.posted == self.each);
                        assert!(!idle, "consumer spins on a slot nobody will finish: {s:?}");
                        n.cpc = 0;
                    }
                }
                // complete: completed + 1 (release)
                2 => {
                    n.completed += 1;
                    n.cpc = 0;
                }
                _ => unreachable!(),
            }
            if n != *s {
                out.push(n);
            }
        }
        out
    }

    /// Explores every interleaving of `producers` producers; returns the
    /// number of distinct states.
    fn check(&self, producers: usize) -> usize {
        let d = self.depth as usize;
        let start = State {
            head: 0,
            completed: 0,
            cache: 0,
            slots: vec![[(0, 0, u64::MAX); 2]; d],
            producers: vec![Producer { pc: 0, posted: 0, ticket: 0, done: 0 }; producers],
            cpc: 0,
            cword: (0, 0, 0),
            next_seq: vec![0; producers],
        };
        let mut seen = HashSet::new();
        let mut stack = vec![start];
        while let Some(s) = stack.pop() {
            if !seen.insert(s.clone()) {
                continue;
            }
            let next = self.steps(&s);
            if next.is_empty() {
                // Final: everything delivered once, in order.
                assert_eq!(s.completed, self.total(&s), "deadlock: {s:?}");
                assert!(s.next_seq.iter().all(|&n| n == self.each), "lost descriptors: {s:?}");
                assert_eq!(s.head, self.total(&s));
            }
            stack.extend(next);
        }
        seen.len()
    }
}

#[test]
fn three_producers_two_posts_depth_two() {
    let states = Model { depth: 2, each: 2, cached: true, credit: true, lap_tags: true }.check(3);
    assert!(states > 1000, "{states}");
}

#[test]
fn two_producers_three_posts_depth_one_and_two() {
    for depth in [1, 2] {
        Model { depth, each: 3, cached: true, credit: true, lap_tags: true }.check(2);
    }
}

#[test]
fn without_tail_cache() {
    Model { depth: 2, each: 2, cached: false, credit: true, lap_tags: true }.check(3);
}

#[test]
fn four_producers_depth_two() {
    Model { depth: 2, each: 1, cached: true, credit: true, lap_tags: true }.check(4);
}

#[test]
#[should_panic(expected = "written without credit")]
fn catches_missing_credit() {
    Model { depth: 2, each: 2, cached: true, credit: false, lap_tags: true }.check(2);
}

#[test]
#[should_panic(expected = "torn or stale")]
fn catches_tags_without_laps() {
    Model { depth: 2, each: 2, cached: true, credit: true, lap_tags: false }.check(2);
}
