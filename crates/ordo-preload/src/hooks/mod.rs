//! The C library's calls this library takes over, by family: every exported symbol is here.
//! Each hook calls the C library's own function ([`crate::real`]) for whatever is not the
//! tunnel's, and runs its body [`crate::guarded`]: no panic crosses into C.

mod datagram;
mod descriptors;
mod exec;
mod hostent;
mod listen;
mod names;
mod res;
mod resolver;
mod stream;

/// For the resolver, which connects its socket as a program's would.
pub(crate) use stream::connect;
