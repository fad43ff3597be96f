//! Built-in tools that need nothing but this machine: a calculator (read) and a note book in
//! the data directory (`note_list` read, `note_write` write). Tools of a particular agent (the
//! SQL tool of the academy admin, the course tutor's search) live with that agent, in the
//! agents crate.

mod calculator;
mod notes;

pub use calculator::{calculator, evaluate, expression_in};
pub use notes::{note_list, note_write};

use crate::{RegistryError, ToolRegistry};
use std::path::Path;

/// A registry with every built-in tool; notes live under `data_dir/notes`.
///
/// # Errors
/// Only if two built-ins shared a name, which the tests rule out.
pub fn registry(data_dir: &Path) -> Result<ToolRegistry, RegistryError> {
    let mut reg = ToolRegistry::new();
    for tool in [calculator(), note_list(data_dir), note_write(data_dir)] {
        reg.register(tool)?;
    }
    Ok(reg)
}
