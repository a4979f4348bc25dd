//! One XLA call frame, read safely: its data buffers (`operand.rs`), its attributes by
//! name (`call.rs`) and their decoding into typed values (`attributes.rs`; communicators,
//! user ops and addresses travel as ids, `handles.rs`), the future of a call that
//! completes later (`deferred.rs`) and the error XLA is handed back (`error.rs`).
//!
//! Between `xla/ffi.rs` (the C ABI, as declared) and the handlers (`handlers/`, what each op
//! does with a call): nothing here knows an op. The table of ops, and everything that
//! reads it, is the handlers'; this is what they all read a call through.

mod attributes;
mod call;
mod deferred;
mod error;
pub mod handles;
mod operand;

pub use attributes::{
    Address, Counts, Devices, Kind, Shown, Sizes, Tree, OP_USER, PEER_ANY, PEER_NULL, TAG_ANY,
    USER_OP,
};
pub(crate) use attributes::{Attr, Attrs};
pub use call::Call;
pub(crate) use deferred::Deferred;
pub(crate) use error::ffi_error;
pub(crate) use operand::Operand;
