//! exec and posix_spawn: the new image inherits the table of tunnel sockets through its
//! environment ([`crate::inherit`]).

use crate::{inherit, real};
use libc::c_int;

extern "C" {
    /// The process's environment (the C library's).
    static environ: *const *const libc::c_char;
}

/// execve(2): the tunnel sockets' table goes along in the new program's environment
/// (`inherit`), so that the library there still knows them. Nothing here allocates: it runs
/// between fork and exec.
///
/// # Safety
/// As execve(2).
#[no_mangle]
pub unsafe extern "C" fn execve(
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
) -> c_int {
    // SAFETY: the caller's arguments, the environment with the table.
    match unsafe { inherit::with_table(envp, |env| real::execve(path, argv, env)) } {
        Some(r) => r,
        // SAFETY: the caller's arguments, unchanged.
        None => unsafe { real::execve(path, argv, envp) },
    }
}

/// execvpe(3): as [`execve`].
///
/// # Safety
/// As execvpe(3).
#[no_mangle]
pub unsafe extern "C" fn execvpe(
    file: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
) -> c_int {
    // SAFETY: the caller's arguments, the environment with the table.
    match unsafe { inherit::with_table(envp, |env| real::execvpe(file, argv, env)) } {
        Some(r) => r,
        // SAFETY: the caller's arguments, unchanged.
        None => unsafe { real::execvpe(file, argv, envp) },
    }
}

/// execv(3): as [`execve`], with the process's environment.
///
/// # Safety
/// As execv(3).
#[no_mangle]
pub unsafe extern "C" fn execv(path: *const libc::c_char, argv: *const *const libc::c_char) -> c_int {
    // SAFETY: the C library's environment; the caller's arguments.
    match unsafe { inherit::with_table(environ, |env| real::execve(path, argv, env)) } {
        Some(r) => r,
        // SAFETY: the caller's arguments, unchanged.
        None => unsafe { real::execv(path, argv) },
    }
}

/// execvp(3): as [`execve`], with the process's environment.
///
/// # Safety
/// As execvp(3).
#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const libc::c_char, argv: *const *const libc::c_char) -> c_int {
    // SAFETY: the C library's environment; the caller's arguments.
    match unsafe { inherit::with_table(environ, |env| real::execvpe(file, argv, env)) } {
        Some(r) => r,
        // SAFETY: the caller's arguments, unchanged.
        None => unsafe { real::execvp(file, argv) },
    }
}

/// posix_spawn(3): as [`execve`] (the C library's runs in this process, as a vfork).
///
/// # Safety
/// As posix_spawn(3).
#[no_mangle]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const libc::c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut libc::c_char,
    envp: *const *mut libc::c_char,
) -> c_int {
    // SAFETY: the caller's arguments, the environment with the table.
    let spawned = unsafe {
        inherit::with_table(envp.cast(), |env| {
            real::posix_spawn(false, pid, path, actions, attr, argv, env.cast())
        })
    };
    // SAFETY: the caller's arguments, unchanged.
    spawned.unwrap_or_else(|| unsafe { real::posix_spawn(false, pid, path, actions, attr, argv, envp) })
}

/// posix_spawnp(3): as [`posix_spawn`].
///
/// # Safety
/// As posix_spawnp(3).
#[no_mangle]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: *const libc::c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut libc::c_char,
    envp: *const *mut libc::c_char,
) -> c_int {
    // SAFETY: the caller's arguments, the environment with the table.
    let spawned = unsafe {
        inherit::with_table(envp.cast(), |env| {
            real::posix_spawn(true, pid, file, actions, attr, argv, env.cast())
        })
    };
    // SAFETY: the caller's arguments, unchanged.
    spawned.unwrap_or_else(|| unsafe { real::posix_spawn(true, pid, file, actions, attr, argv, envp) })
}
