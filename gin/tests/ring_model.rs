//! Exhaustive interleaving check of one ring's protocol (a model of
//! `devcomm_device::gin::queue::post` and of `Rings::poll`/`complete`).
//!
//! Every thread is a state machine whose steps are single shared-memory
//! accesses; the explorer runs every interleaving (depth-first, with
//! memoised states) of a few producers and the consumer and checks that
//!
//! * a producer writes a slot only while no reader is inside it and only
//!   after the consumer has completed the ticket that used it before
//!   (credit), and the consumer never reads a half-written body;
//! * per producer, descriptors arrive in order, none lost or duplicated;
//! * no interleaving deadlocks.
//!
//! Spin loops are modelled as blocking steps (enabled once their condition
//! holds), which covers every number of spins. Accesses are sequentially
//! consistent here: the memory orderings (acquire/release) are what the
//! GPU tests and the host stress tests exercise.

use std::collections::HashSet;

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Producer {
    pc: u8,
    posted: u8,
    ticket: u64,
    done: u64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct State {
    head: u64,
    completed: u64,
    cache: u64,
    /// Per slot: published ticket + 1, body halves (producer, seq).
    tickets: Vec<u64>,
    body: Vec<(u8, u8)>,
    /// Slot being written by a producer between its two half stores.
    writing: Vec<bool>,
    producers: Vec<Producer>,
    /// Consumer: pc, and the first half it read.
    cpc: u8,
    chalf: u8,
    next_seq: Vec<u8>,
}

struct Model {
    depth: u64,
    each: u8,
    cached: bool,
    /// Off: producers skip the credit check (a broken protocol the
    /// explorer must reject).
    credit: bool,
}

impl Model {
    fn total(&self, s: &State) -> u64 {
        s.producers.len() as u64 * self.each as u64
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
            let mut n = s.clone();
            let q = &mut n.producers[i];
            let slot = (p.ticket % d) as usize;
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
                // body, first half
                4 => {
                    assert!(p.ticket < s.completed + d, "slot {slot} written without credit (ticket {})", p.ticket);
                    assert!(!(s.cpc == 2 && (s.completed % d) as usize == slot), "slot {slot} written while read");
                    n.body[slot].0 = i as u8;
                    n.writing[slot] = true;
                    q.pc = 5;
                }
                // body, second half
                5 => {
                    n.body[slot].1 = p.posted;
                    n.writing[slot] = false;
                    q.pc = 6;
                }
                // ticket + 1 with release
                6 => {
                    n.tickets[slot] = p.ticket + 1;
                    q.posted += 1;
                    q.pc = 0;
                }
                _ => unreachable!(),
            }
            out.push(n);
        }
        if s.completed < self.total(s) {
            let slot = (s.completed % d) as usize;
            let mut n = s.clone();
            match s.cpc {
                // poll: wait for ticket_plus_one == completed + 1 (acquire)
                0 if s.tickets[slot] == s.completed + 1 => n.cpc = 1,
                0 => {}
                1 => {
                    assert!(!s.writing[slot], "read of a half-written body");
                    n.chalf = s.body[slot].0;
                    n.cpc = 2;
                }
                2 => {
                    assert!(!s.writing[slot], "read of a half-written body");
                    let (p, seq) = (s.chalf as usize, s.body[slot].1);
                    assert_eq!(s.body[slot].0 as usize, p, "torn body");
                    assert_eq!(seq, s.next_seq[p], "producer {p}: lost, duplicated or reordered");
                    n.next_seq[p] += 1;
                    n.cpc = 3;
                }
                // complete: completed + 1 (release)
                3 => {
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
            tickets: vec![0; d],
            body: vec![(0, 0); d],
            writing: vec![false; d],
            producers: vec![Producer { pc: 0, posted: 0, ticket: 0, done: 0 }; producers],
            cpc: 0,
            chalf: 0,
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
    let states = Model { depth: 2, each: 2, cached: true, credit: true }.check(3);
    assert!(states > 1000, "{states}");
}

#[test]
fn two_producers_three_posts_depth_one_and_two() {
    for depth in [1, 2] {
        Model { depth, each: 3, cached: true, credit: true }.check(2);
    }
}

#[test]
fn without_tail_cache() {
    Model { depth: 2, each: 2, cached: false, credit: true }.check(3);
}

#[test]
fn four_producers_depth_two() {
    Model { depth: 2, each: 1, cached: true, credit: true }.check(4);
}

#[test]
#[should_panic]
fn catches_missing_credit() {
    Model { depth: 2, each: 2, cached: true, credit: false }.check(2);
}
