//! XLA's ragged all-to-all among devices: each member sends rows of its input, as many as
//! its `send_sizes` say, to where its `output_offsets` say in each other member's output.
//!
//! Bad sizes or offsets must end every member's call with an error, and must leave nobody
//! waiting. Each sender checks its own (every device's output has the same shape, so a
//! sender can check where its rows land), then tells each receiver where its rows go and
//! how many, or that it failed (an all-to-all of one notice per pair, MPI's own among the
//! processes where it fits): every member hears from every member, so all agree on the
//! lowest failing member before any row moves. The rows then go as messages.

use super::buffers::copy;
use super::collectives::{all_to_all, AllToAll};
use super::group::Group;
use super::messages::{exchange, touching, Piece};
use super::seat::{Seat, Span};
use crate::{Backend, Dtype, Error, Library, Result};

/// The operands, by their place in a seat's `args`.
const INPUT: usize = 0;
const OUTPUT: usize = 1;
const INPUT_OFFSETS: usize = 2;
const SEND_SIZES: usize = 3;
const OUTPUT_OFFSETS: usize = 4;

/// What a sender tells each receiver: where its rows go, and how many; `at < 0`: the
/// sender failed its checks.
#[derive(Clone, Copy, Default)]
#[repr(C)]
struct Notice {
    at: i64,
    rows: i64,
}

const FAILED: Notice = Notice { at: -1, rows: 0 };

/// One member's rows to each member: (first input row, rows, first output row there).
type Plan = Vec<(usize, usize, usize)>;

pub fn ragged_all_to_all(
    group: &Group,
    library: &dyn Library,
    backend: &dyn Backend,
    seats: &[Seat],
    row: usize,
    name: &'static str,
) -> Result<()> {
    let n = group.size();
    let mut plans = Vec::with_capacity(seats.len());
    let mut errors = Vec::with_capacity(seats.len());
    for s in seats {
        copy(&s.args[OUTPUT], &s.rets[0]);
        match plan(s, n, row, name) {
            Ok(plan) => {
                plans.push(plan);
                errors.push(None);
            }
            Err(err) => {
                plans.push(Vec::new());
                errors.push(Some(err));
            }
        }
    }
    let mut sent: Vec<Vec<Notice>> = plans
        .iter()
        .zip(&errors)
        .map(|(plan, error)| match error {
            Some(_) => vec![FAILED; n],
            None => plan
                .iter()
                .map(|&(_, rows, at)| Notice {
                    at: at as i64,
                    rows: rows as i64,
                })
                .collect(),
        })
        .collect();
    let mut heard = vec![vec![Notice::default(); n]; seats.len()];
    // One notice from each member to each: an all-to-all of fixed blocks, one MPI call
    // among the processes wherever it fits.
    let bytes = |notices: &mut Vec<Notice>| Span {
        ptr: notices.as_mut_ptr() as usize,
        count: n * std::mem::size_of::<Notice>(),
        dtype: Dtype::U8,
    };
    let notices: Vec<Seat> = sent
        .iter_mut()
        .zip(&mut heard)
        .map(|(said, told)| Seat::of_buffers(seats[0].key, bytes(said), bytes(told)))
        .collect();
    all_to_all(
        group,
        library,
        backend,
        &notices,
        AllToAll::Array { outer: 1 },
    )?;
    if let Some(failed) = heard[0].iter().position(|h| h.at < 0) {
        if group.is_local(failed) {
            if let Some(err) = errors[group.slot(failed)].take() {
                return Err(err);
            }
        }
        return Err(Error::invalid_argument(
            name,
            format!(
                "member {failed} of the group (device {}) gave sizes or offsets that do not \
                 fit; its error says which",
                group.devices[failed]
            ),
        ));
    }
    let rows_moved = touching(group, 1, |i, j, _| {
        let (send, rows) = match group.is_local(i) {
            true => {
                let s = group.slot(i);
                let (first, rows, _) = plans[s][j];
                (seats[s].args[INPUT].ptr + first * row, rows)
            }
            false => (0, heard[group.slot(j)][i].rows as usize),
        };
        let recv = match group.is_local(j) {
            true => {
                let s = group.slot(j);
                seats[s].rets[0].ptr + heard[s][i].at as usize * row
            }
            false => 0,
        };
        Piece {
            from: i,
            to: j,
            bytes: rows * row,
            send,
            recv,
        }
    });
    exchange(group, library, backend, &rows_moved)
}

/// A member's rows to each member, checked against its input and output.
fn plan(seat: &Seat, n: usize, row: usize, name: &'static str) -> Result<Plan> {
    let list = |k: usize, what: &str| -> Result<Vec<usize>> {
        let values = rows(&seat.args[k], what, name)?;
        if values.len() != n {
            return Err(Error::invalid_argument(
                name,
                format!("{what} has {} entries for a group of {n}", values.len()),
            ));
        }
        Ok(values)
    };
    let input_offsets = list(INPUT_OFFSETS, "input_offsets")?;
    let send_sizes = list(SEND_SIZES, "send_sizes")?;
    let output_offsets = list(OUTPUT_OFFSETS, "output_offsets")?;
    let input_rows = seat.args[INPUT].bytes() / row.max(1);
    let output_rows = seat.rets[0].bytes() / row.max(1);
    let mut plan = Vec::with_capacity(n);
    for j in 0..n {
        let (first, rows, at) = (input_offsets[j], send_sizes[j], output_offsets[j]);
        if first.saturating_add(rows) > input_rows {
            return Err(Error::invalid_argument(
                name,
                format!(
                    "rows {first}..{} sent to member {j} lie outside the input's {input_rows}",
                    first.saturating_add(rows)
                ),
            ));
        }
        if at.saturating_add(rows) > output_rows {
            return Err(Error::invalid_argument(
                name,
                format!(
                    "rows sent to member {j} land at {at}..{}, outside its output's \
                     {output_rows}",
                    at.saturating_add(rows)
                ),
            ));
        }
        plan.push((first, rows, at));
    }
    Ok(plan)
}

/// An offsets or sizes operand, in rows.
fn rows(span: &Span, what: &str, name: &'static str) -> Result<Vec<usize>> {
    // SAFETY: a live operand of a meeting call, `count` elements of its dtype.
    let values: Vec<i64> = unsafe {
        match span.dtype {
            Dtype::I64 => std::slice::from_raw_parts(span.ptr as *const i64, span.count).to_vec(),
            Dtype::I32 => std::slice::from_raw_parts(span.ptr as *const i32, span.count)
                .iter()
                .map(|&v| i64::from(v))
                .collect(),
            other => {
                return Err(Error::invalid_argument(
                    name,
                    format!("{what} must be int32 or int64, is {other}"),
                ))
            }
        }
    };
    values
        .into_iter()
        .map(|v| {
            usize::try_from(v)
                .map_err(|_| Error::invalid_argument(name, format!("{what} holds {v}, below zero")))
        })
        .collect()
}
