//! exec and posix_spawn: the new image inherits the table of tunnel sockets through its
//! environment ([`crate::inherit`]).

use crate::{inherit, real};
use libc::c_int;

extern "C" {
    /// The process's environment (the C library's).
    static environ: *const *const libc::c_char;
}

type Env = *const *const libc::c_char;

/// Every exec hook's one body: `exec` with `envp` and the table added, or, where there is no
/// table to hand on or it does not fit, `plain` (the call as the program made it).
///
/// # Safety
/// `envp` is null or a null-terminated array of C strings; `exec` and `plain` are the
/// caller's call, which the caller's own contract covers.
unsafe fn with_table_or<R>(envp: Env, exec: impl FnOnce(Env) -> R, plain: impl FnOnce() -> R) -> R {
    // SAFETY: as this function's contract.
    unsafe { inherit::with_table(envp, exec) }.unwrap_or_else(plain)
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
    // SAFETY: the caller's arguments, with the table or unchanged.
    unsafe {
        with_table_or(
            envp,
            |env| real::execve(path, argv, env),
            || real::execve(path, argv, envp),
        )
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
    // SAFETY: the caller's arguments, with the table or unchanged.
    unsafe {
        with_table_or(
            envp,
            |env| real::execvpe(file, argv, env),
            || real::execvpe(file, argv, envp),
        )
    }
}

/// execv(3): as [`execve`], with the process's environment.
///
/// # Safety
/// As execv(3).
#[no_mangle]
pub unsafe extern "C" fn execv(path: *const libc::c_char, argv: *const *const libc::c_char) -> c_int {
    // SAFETY: the C library's environment; the caller's arguments.
    unsafe { with_table_or(environ, |env| real::execve(path, argv, env), || real::execv(path, argv)) }
}

/// execvp(3): as [`execve`], with the process's environment.
///
/// # Safety
/// As execvp(3).
#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const libc::c_char, argv: *const *const libc::c_char) -> c_int {
    // SAFETY: the C library's environment; the caller's arguments.
    unsafe {
        with_table_or(
            environ,
            |env| real::execvpe(file, argv, env),
            || real::execvp(file, argv),
        )
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
    // SAFETY: the caller's arguments, and an environment as the caller's contract has it.
    let spawn = |env| unsafe { real::posix_spawn(false, pid, path, actions, attr, argv, env) };
    // SAFETY: the caller's environment.
    unsafe { with_table_or(envp.cast(), |env| spawn(env.cast()), || spawn(envp)) }
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
    // SAFETY: the caller's arguments, and an environment as the caller's contract has it.
    let spawn = |env| unsafe { real::posix_spawn(true, pid, file, actions, attr, argv, env) };
    // SAFETY: the caller's environment.
    unsafe { with_table_or(envp.cast(), |env| spawn(env.cast()), || spawn(envp)) }
}
