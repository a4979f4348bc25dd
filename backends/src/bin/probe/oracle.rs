//! `--oracle` (feature `linked`): the linked backend, built from the library's own mpi.h,
//! against the dlopened backend of the same library file, which uses jaxmpi's hand-written
//! family tables. They must agree on every predefined datatype (size and name), on the
//! constants, on the communicators (MPI_Comm_compare is MPI_IDENT across the two), and on
//! every predefined op (identical reduction results on every dtype it supports); and each
//! must pass the whole probe.

use jaxmpi_backends::mpi::inspect::{Facts, Inspect};
use jaxmpi_core::{Dtype, Input, ReduceOp};

use crate::array::{Array, Value};
use crate::report::{Group, Probe};
use crate::{comms, quoted, run, summary};

/// Elements per reduction: odd, and more than any library's vectorization width.
const COUNT: usize = 1001;

/// Runs the oracle; returns the exit code (the same on every rank).
pub fn oracle(trace: bool) -> i32 {
    let started = std::time::Instant::now();
    let (linked, loaded) = match jaxmpi_backends::select::linked::load_twins() {
        Ok((linked, loaded)) => (Box::leak(linked), Box::leak(loaded)),
        Err(err) => {
            println!("PROBE FAIL rank=? error={}", quoted(&err.to_string()));
            return 1;
        }
    };
    let mut p = Probe::new(linked.library(), -1, trace);
    let Some(world) = comms::world(&mut p) else {
        println!("PROBE FAIL rank=? error=\"the world communicator has no rank or size\"");
        return 1;
    };
    p.rank = world.rank;
    let compared = match (linked.facts(), loaded.facts()) {
        (Ok(mine), Ok(theirs)) => compare_facts(&mut p, &mine, &theirs, &[&*linked, &*loaded]),
        (Err(err), _) | (_, Err(err)) => {
            p.fail("the predefined handles", "their facts", err);
            [0; 3]
        }
    };
    let reductions = compare_reductions(&mut p, &world, linked.library(), loaded.library());
    run(&mut p, &world, false);
    let linked_checks = p.checks;
    let mut other = Probe::new(loaded.library(), world.rank, trace);
    run(&mut other, &world, false);
    p.checks += other.checks;
    p.failures += other.failures;
    if world.rank == 0 {
        println!(
            "ORACLE compared datatypes={} constants={} comm_compares={} op_dtype_reductions={} \
             probe_checks_linked={linked_checks} probe_checks_loaded={} library={}",
            compared[0],
            compared[1],
            compared[2],
            reductions,
            other.checks,
            p.library.info().path.display()
        );
    }
    let code = summary(&mut p, &world, started);
    if let Err(err) = p.library.finalize() {
        println!("rank {}: FAIL finalize: {err}", world.rank);
        return 1;
    }
    code
}

/// Returns how many datatypes, constants and communicator comparisons were checked.
fn compare_facts(
    p: &mut Probe,
    linked: &Facts,
    loaded: &Facts,
    both: &[&dyn Inspect],
) -> [usize; 3] {
    p.check(
        "number of datatypes",
        linked.datatypes.len(),
        loaded.datatypes.len(),
    );
    for ((dtype, size, name), (_, their_size, their_name)) in
        linked.datatypes.iter().zip(&loaded.datatypes)
    {
        p.check(
            &format!("MPI_Type_size of the {dtype} datatype (mpi.h vs table)"),
            size,
            their_size,
        );
        p.check(
            &format!("MPI_Type_get_name of the {dtype} datatype (mpi.h vs table)"),
            name,
            their_name,
        );
    }
    p.check(
        "number of constants",
        linked.constants.len(),
        loaded.constants.len(),
    );
    for ((name, value), (_, theirs)) in linked.constants.iter().zip(&loaded.constants) {
        p.check(&format!("{name} (mpi.h vs table)"), value, theirs);
    }
    let pairs = [
        ("MPI_COMM_WORLD", linked.world, loaded.world),
        ("MPI_COMM_SELF", linked.self_comm, loaded.self_comm),
    ];
    let mut compares = 0;
    for (name, mine, theirs) in pairs {
        for (which, backend) in ["linked", "loaded"].into_iter().zip(both) {
            let label =
                format!("MPI_Comm_compare of the two {name} handles through the {which} backend");
            if let Some(ident) = p.ok(&label, backend.comm_ident(mine, theirs)) {
                p.check(&format!("{label} is MPI_IDENT"), true, ident);
            }
            compares += 1;
        }
    }
    [linked.datatypes.len(), linked.constants.len(), compares]
}

/// A rank- and index-dependent element every dtype holds exactly.
fn element(dtype: Dtype, rank: i32, index: usize) -> Value {
    let v = ((index * 5 + rank as usize * 3) % 7) as i128;
    if dtype == Dtype::Bool {
        Value::Int(v % 2)
    } else if dtype.is_complex() {
        Value::Complex(v as f64 - 2.5, 1.0 - v as f64)
    } else if dtype.is_float() {
        Value::Float(v as f64 - 2.5)
    } else {
        Value::Int(v - 3)
    }
}

/// Each predefined op on each dtype it supports, through both backends; returns the count.
fn compare_reductions(
    p: &mut Probe,
    world: &Group,
    linked: &'static dyn jaxmpi_core::Library,
    loaded: &'static dyn jaxmpi_core::Library,
) -> usize {
    let mut compared = 0;
    for op in ReduceOp::PREDEFINED {
        for dtype in Dtype::ALL.into_iter().filter(|&d| op.supports(d)) {
            let input = Array::from_fn(dtype, COUNT, |i| element(dtype, world.rank, i));
            let mut results = [Array::zeroed(dtype, COUNT), Array::zeroed(dtype, COUNT)];
            for (library, out) in [linked, loaded].into_iter().zip(&mut results) {
                let label = format!(
                    "allreduce {op} on {dtype} through {}",
                    library.info().chosen_by
                );
                let (input, out) = (Input::Data(input.buf()), out.buf_mut());
                p.ok(
                    &label,
                    library.backend().allreduce(world.comm, input, out, op),
                );
            }
            let [mine, theirs] = &results;
            p.check(
                &format!("allreduce {op} on {dtype}: first element where linked and loaded differ"),
                None,
                mine.first_difference(theirs),
            );
            compared += 1;
        }
    }
    compared
}
