//! Where the devices of one process that are members of one group meet, call after call:
//! the n-th call of every member is the same call (`Group::meet` checks the seats say so
//! before anything runs), and the last to arrive runs it for all.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::{Error, ErrorKind, Result};

/// How long a member waiting for its round yields its core before it sleeps: a round of
/// small messages takes microseconds, and being woken from a condition variable on a busy
/// machine about as many again (a halo exchange of 256 bytes at 2 processes x 2 devices
/// on 2 cores: 48 µs a step sleeping at once, 31 µs yielding first; benches/RESULTS.md).
const YIELDING: Duration = Duration::from_micros(200);

/// Where the devices of one process meet, call after call, each bringing an `S`.
pub struct Room<S> {
    members: usize,
    state: Mutex<RoomState<S>>,
    changed: Condvar,
    /// Rounds completed: they complete in order (a member's next call comes after its
    /// last returned), so a waiter of round n is done once this passes n.
    done: AtomicU64,
}

struct RoomState<S> {
    /// Each member's next call number: the n-th call of every member is the same call.
    next: Vec<u64>,
    rounds: HashMap<u64, Round<S>>,
}

struct Round<S> {
    seats: Vec<Option<S>>,
    arrived: usize,
    outcome: Option<Result<()>>,
    collected: usize,
}

impl<S: Clone + Default> Room<S> {
    pub fn new(members: usize) -> Room<S> {
        Room {
            members,
            state: Mutex::new(RoomState {
                next: vec![0; members],
                rounds: HashMap::new(),
            }),
            changed: Condvar::new(),
            done: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, RoomState<S>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn meet(&self, slot: usize, seat: S, run: impl FnOnce(&[S]) -> Result<()>) -> Result<()> {
        let members = self.members;
        let mut state = self.lock();
        let number = state.next[slot];
        state.next[slot] += 1;
        let round = state.rounds.entry(number).or_insert_with(|| Round {
            seats: vec![None; members],
            arrived: 0,
            outcome: None,
            collected: 0,
        });
        round.seats[slot] = Some(seat);
        round.arrived += 1;
        if round.arrived == members {
            let seats: Vec<S> = round
                .seats
                .iter_mut()
                .map(|s| s.take().unwrap_or_default())
                .collect();
            drop(state);
            // Everyone else waits for this outcome: a panic must become one.
            let outcome = catch_unwind(AssertUnwindSafe(|| run(&seats))).unwrap_or_else(|_| {
                Err(Error::new(
                    ErrorKind::Unsupported,
                    "collective",
                    "internal error (panic) while the devices of this process met",
                ))
            });
            state = self.lock();
            if let Some(round) = state.rounds.get_mut(&number) {
                round.outcome = Some(outcome);
            }
            self.done.store(number + 1, Ordering::Release);
            self.changed.notify_all();
        } else {
            // A round takes microseconds: yielding the core to the members still to
            // arrive (and to the one that runs it) until it is done costs less than
            // sleeping on the condition variable and being woken.
            drop(state);
            let start = Instant::now();
            while self.done.load(Ordering::Acquire) <= number && start.elapsed() < YIELDING {
                std::thread::yield_now();
            }
            state = self.lock();
        }
        loop {
            let round = state.rounds.get_mut(&number);
            if let Some(outcome) = round.as_ref().and_then(|r| r.outcome.clone()) {
                let round = state.rounds.get_mut(&number).expect("the round just read");
                round.collected += 1;
                if round.collected == members {
                    state.rounds.remove(&number);
                }
                return outcome;
            }
            state = self.changed.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }
}
