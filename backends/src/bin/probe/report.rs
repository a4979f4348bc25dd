//! Counting checks and reporting failures, one line each, so a CI log shows exactly which
//! op, dtype and size went wrong on which rank.

use std::fmt::{Debug, Display};

use jaxmpi_core::{Backend, Comm, Library, Result};

use crate::array::Array;
use crate::known::Bug;

/// Failures printed per rank; later ones are only counted, so a systematic bug does not
/// bury the log.
const SHOWN_FAILURES: u64 = 20;

pub struct Probe {
    pub library: &'static dyn Library,
    /// `library`'s ops.
    pub backend: &'static dyn Backend,
    /// Rank in the world communicator, for messages.
    pub rank: i32,
    pub checks: u64,
    pub failures: u64,
    /// Known library bugs this rank ran into (see `known`).
    pub known_bugs: Vec<&'static str>,
    /// Print each test's label before running it: when a library crashes, the last line
    /// names the culprit.
    pub trace: bool,
}

/// A communicator under test, with this rank's place in it.
#[derive(Clone, Copy, Debug)]
pub struct Group {
    pub comm: Comm,
    /// Appears in every check label ("world", "dup", "split", ...).
    pub name: &'static str,
    pub rank: i32,
    pub size: i32,
}

impl Group {
    /// The ranks next to this one in a ring: (left, right).
    pub fn neighbours(&self) -> (i32, i32) {
        (
            (self.rank + self.size - 1) % self.size,
            (self.rank + 1) % self.size,
        )
    }

    /// Distinct roots worth testing: the first and the last rank.
    pub fn roots(&self) -> Vec<i32> {
        let mut roots = vec![0, self.size - 1];
        roots.dedup();
        roots
    }
}

impl Probe {
    pub fn new(library: &'static dyn Library, rank: i32, trace: bool) -> Probe {
        Probe {
            library,
            backend: library.backend(),
            rank,
            checks: 0,
            failures: 0,
            known_bugs: Vec::new(),
            trace,
        }
    }

    pub fn start(&self, label: &str) {
        if self.trace {
            println!("rank {}: RUN {label}", self.rank);
        }
    }

    pub fn fail(&mut self, what: &str, expected: impl Display, got: impl Display) {
        self.failures += 1;
        if self.failures <= SHOWN_FAILURES {
            println!(
                "rank {}: FAIL {what} expected {expected} got {got}",
                self.rank
            );
        } else if self.failures == SHOWN_FAILURES + 1 {
            println!(
                "rank {}: further failures are counted, not shown",
                self.rank
            );
        }
    }

    /// Records that a known library bug showed (or made a test be skipped).
    pub fn known_bug(&mut self, bug: &'static Bug) {
        if !self.known_bugs.contains(&bug.id) {
            self.known_bugs.push(bug.id);
        }
    }

    pub fn check<T: PartialEq + Debug>(&mut self, what: &str, expected: T, got: T) -> bool {
        self.checks += 1;
        let same = expected == got;
        if !same {
            self.fail(what, format!("{expected:?}"), format!("{got:?}"));
        }
        same
    }

    /// The call must succeed; its value is returned for further checks.
    pub fn ok<T>(&mut self, what: &str, result: Result<T>) -> Option<T> {
        self.checks += 1;
        match result {
            Ok(value) => Some(value),
            Err(err) => {
                self.fail(what, "success", format!("error \"{err}\""));
                None
            }
        }
    }

    /// The call must be refused with an error (and so must not have crashed or hung).
    pub fn refused<T: Debug>(&mut self, what: &str, result: Result<T>) {
        self.checks += 1;
        if let Ok(value) = result {
            self.fail(what, "an error", format!("Ok({value:?})"));
        }
    }

    /// `got` must hold the same values as `expected`; the first differing element is shown.
    pub fn data(&mut self, what: &str, expected: &Array, got: &Array) {
        self.checks += 1;
        let mismatch = if expected.count() != got.count() {
            Some((
                what.to_string(),
                format!("{} elements", expected.count()),
                format!("{} elements", got.count()),
            ))
        } else {
            expected.first_difference(got).map(|(i, want, have)| {
                (
                    format!("{what} [element {i}]"),
                    want.to_string(),
                    have.to_string(),
                )
            })
        };
        if let Some((what, want, have)) = mismatch {
            self.fail(&what, want, have);
        }
    }

    /// An op that fills `out`: checks it succeeded, then its data.
    pub fn result(&mut self, what: &str, result: Result<()>, expected: &Array, out: &Array) {
        if self.ok(what, result).is_some() {
            self.data(what, expected, out);
        }
    }
}
