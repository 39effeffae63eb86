//! The lowest layer of the daemon's I/O: how it reads the small files it is given
//! ([`bounded_read`]: regular files only, up to a cap, never blocking on a FIFO), how it
//! creates its own ([`private_files`]: 0600/0700, never through a symbolic link,
//! temporaries exclusive), and the aligned buffers O_DIRECT needs ([`aligned_buf`]). It
//! knows nothing of caches or protocols; the store, the NBD protocol and the daemon build
//! on it.

#![warn(unreachable_pub)]

pub mod aligned_buf;
pub mod bounded_read;
pub mod private_files;
