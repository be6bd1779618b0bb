//! Configuration files: the wg-quick format ([`wgquick`]), and reading one from disk
//! ([`file`]).

pub mod file;
pub mod wgquick;

pub use file::{load, set_request};
