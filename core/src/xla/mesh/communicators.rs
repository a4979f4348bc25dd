//! A program's communicators among processes, made by its prologue: the pass puts a call
//! of `jaxmpi_hlo_communicators` before every other MPI call of a program, listing every
//! group its collectives name (a permute's: the devices its pairs connect). At the
//! program's first run each process makes there the communicators of the groups it is in,
//! one after another in the list's order, before any device of it meets another: every
//! process of a group makes them at the same point of its program (MPI_Comm_create_group is
//! collective over them), whichever branches its devices take later, and the order is the
//! same on every process, so that nothing waits on a making another process has yet to
//! reach. Later runs find them made: each device thread remembers the lists it has seen.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use super::group::{self, program_tag};
use super::place::listed_kinds;
use crate::xla::devices;
use crate::{Library, Result};

type Making = Arc<OnceLock<Result<()>>>;

thread_local! {
    /// The lists this thread's device has seen made (their contents: the memory of one may
    /// hold another program's since).
    static SEEN: RefCell<Vec<Box<[i64]>>> = const { RefCell::new(Vec::new()) };
}

/// How many lists a thread remembers.
const REMEMBERED: usize = 16;

/// Makes, once per process, the communicators among processes of the groups `flat` lists
/// (each group's size, then its devices) that this process is in.
pub fn make_program_communicators(library: &dyn Library, flat: &[i64]) -> Result<()> {
    if SEEN.with_borrow(|seen| seen.iter().any(|s| **s == *flat)) {
        return Ok(());
    }
    let making = {
        static PROGRAMS: OnceLock<Mutex<HashMap<Vec<i64>, Making>>> = OnceLock::new();
        let mut programs = PROGRAMS
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match programs.get(flat) {
            Some(making) => making.clone(),
            None => programs.entry(flat.to_vec()).or_default().clone(),
        }
    };
    // The process's other devices of the program wait here for the one making them.
    making.get_or_init(|| make(library, flat)).clone()?;
    SEEN.with_borrow_mut(|seen| {
        if seen.len() == REMEMBERED {
            seen.remove(0);
        }
        seen.push(flat.into());
    });
    Ok(())
}

fn make(library: &dyn Library, flat: &[i64]) -> Result<()> {
    let me = library.comm_rank(library.world())?;
    for (index, (kind, devices)) in listed_kinds(flat)?.into_iter().enumerate() {
        let owners = devices
            .iter()
            .map(|&d| devices::owner(d))
            .collect::<Result<Vec<_>>>()?;
        if owners.contains(&me) {
            let tag = program_tag(flat, index);
            group::group(library, kind, devices)?.make(library, tag)?;
        }
    }
    Ok(())
}
