//! jaxmpi's own profile (`JAXMPI_PROFILE=DIR`, `jaxmpi.profile(DIR)`): every call jaxmpi
//! makes, on every route (its ops on MPI communicators and MeshComms, JAX's collectives
//! through the pass and through XLA's MPI backend), with its bytes, communicator or
//! device, call site, start and end, and a started op's request from start to completion.
//!
//! - `ring.rs`: the records, in memory set aside at the start, and the totals per op;
//!   `begin` is all a call pays while no profile records (one load);
//! - `strings.rs`: op names and call sites as numbers;
//! - `clock.rs`: the clock records are stamped with, set against rank 0's;
//! - `trace.rs`: a rank's records as a Chrome trace, on rank 0's clock.
//!
//! Where calls are recorded: the handlers' one path (`handlers/entry.rs`, through
//! `handlers/services/profiled.rs`), a request's completion (`handlers/requests/`), XLA's
//! own MPI calls (`plugin_calls.rs`). Python starts and stops a profile, measures the
//! clocks and writes the files (python/src/profile.rs, python/jaxmpi/_runtime/profile.py).

mod clock;
mod ring;
mod strings;
mod trace;

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

pub use clock::{now_ns, ns_of, set_skew, sync, Alignment, Sync, ROUNDS};
pub use ring::{
    begin, recording, records, start, stop, texts, threads, totals, Begun, Fields, Kind, Record,
    Route, Stats, Total,
};
pub use trace::{json_string, Texts, Trace};

/// Writes this rank's records as a trace at `path`, through a file beside it renamed over
/// it once complete: a rank that dies while writing leaves no partial trace. Returns the
/// number of call events.
pub fn write_file(path: &Path, trace: &Trace) -> io::Result<usize> {
    let records = records();
    let (names, sites) = texts();
    let threads = threads();
    let texts = Texts {
        names: &names,
        sites: &sites,
        threads: &threads,
    };
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    let partial = Path::new(&partial);
    let written = (|| {
        let mut out = BufWriter::new(File::create(partial)?);
        let n = trace::write(&mut out, trace, &records, &texts)?;
        out.flush()?;
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        Ok::<usize, io::Error>(n)
    })();
    match written {
        Ok(n) => {
            std::fs::rename(partial, path)?;
            Ok(n)
        }
        Err(err) => {
            let _ = std::fs::remove_file(partial);
            Err(err)
        }
    }
}
