//! What every handler call does around its op body, whatever the op: its life from
//! attributes decoded to the monitor's last line (`lifecycle.rs`), how it is named when it
//! fails (`call_info.rs`), checked mode's and start verdicts' exchanges before a
//! collective (`checked/`, `start_verdict.rs`), the failure of a call nobody waits for,
//! kept for later (`pending.rs`), and a GPU call's body run by the GPU runtime
//! (`gpu.rs`).
//!
//! Services, not op bodies: each is one rule for every op, switched per process (several
//! by Python); of them, the op bodies (`handlers/ops.rs`) call only checked mode's
//! point-to-point headers. They read the op table (which ops are collectives, checked
//! mode's op numbers) and the table's exported handlers call them: they live inside
//! `handlers/`, under the table, which is the folder's door (`handlers/mod.rs`).

pub(super) mod call_info;
pub mod checked;
pub(super) mod gpu;
pub(super) mod lifecycle;
pub mod pending;
pub mod start_verdict;
