//! Configuration files: the wg-quick format.

pub mod wgquick;
