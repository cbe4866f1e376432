//! `tessera __fork-server`: a started `tessera` that runs commands in forks of itself.
//!
//! Starting `tessera` costs about 0.4 s of CPU before `main` runs: the dynamic loader maps
//! libtorch and its CUDA libraries and their static constructors register every operator. A
//! caller that runs many short commands (the test suite runs over a thousand) starts this once
//! and sends it commands instead. For each one it forks a process that takes the command's
//! folder, environment and output files and returns to `main` with the command's arguments,
//! which runs them exactly as a freshly started `tessera` would: nothing but the loading and
//! the static constructors was done before the fork, and this process never starts a thread,
//! never touches a device and never runs an operator, so the fork is as clean as a new start.
//!
//! Not a user command (it is not in `--help`). The protocol, one line each, on stdin and stdout:
//!
//! - request: a JSON object `{"id", "args", "cwd", "set": [[key, value]], "remove": [key],
//!   "stdout", "stderr"}`: run `tessera <args>` in `cwd` with the server's environment less
//!   `remove` plus `set`, stdin from `/dev/null`, stdout and stderr written to those files;
//! - replies: `pid <id> <pid>` once the command's process runs (the caller may signal it), then
//!   `exit <id> <wait status>` (as `waitpid` gives it) when it ends; or `error <id> <message>`
//!   when it could not be started.
//!
//! The server ends when its stdin ends (the caller exited). Each command has a small process of
//! its own that waits for it and writes its replies (they are single `write`s shorter than a
//! pipe's atomic size, so replies of commands ending together do not mix).

use std::ffi::{CString, OsString};
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::mem::ManuallyDrop;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::FromRawFd;
use std::path::PathBuf;

/// The hidden first argument that starts the server.
pub const ARG: &str = "__fork-server";

#[derive(serde::Deserialize)]
struct Request {
    id: u64,
    args: Vec<String>,
    cwd: PathBuf,
    #[serde(default)]
    set: Vec<(String, String)>,
    #[serde(default)]
    remove: Vec<String>,
    stdout: PathBuf,
    stderr: PathBuf,
}

/// With `tessera __fork-server`, serves requests until stdin ends and exits; in each command's
/// process, returns its command line (the program name first) for `main` to run. Without that
/// argument, returns `None` at once.
pub fn serve_if_asked() -> Option<Vec<OsString>> {
    let mut args = std::env::args_os();
    let program = args.next()?;
    if args.next().as_deref() != Some(ARG.as_ref()) {
        return None;
    }
    // Commands' processes are waited for by their own waiter; the server reaps its waiters.
    // SAFETY: setting a signal's disposition has no memory effects.
    unsafe { libc::signal(libc::SIGCHLD, libc::SIG_IGN) };
    // Read through a buffer of our own rather than Rust's stdin: a command's process drops it
    // on its way back to `main`, so a command that reads stdin cannot see requests. Never
    // closed here: the command's process has `/dev/null` as file descriptor 0 by then.
    // SAFETY: file descriptor 0 is open for the whole process and is never closed through this.
    let stdin = ManuallyDrop::new(unsafe { File::from_raw_fd(0) });
    let mut requests = BufReader::new(&*stdin);
    let mut line = String::new();
    loop {
        line.clear();
        match requests.read_line(&mut line) {
            Ok(0) | Err(_) => std::process::exit(0),
            Ok(_) => {}
        }
        let request: Request = match serde_json::from_str(&line) {
            Ok(r) => r,
            Err(e) => {
                reply(&format!("error 0 unreadable request: {e}"));
                continue;
            }
        };
        if let Some(args) = start(&program, request) {
            return Some(args);
        }
    }
}

/// Forks the waiter of `request`; in the command's process (a child of the waiter), sets it up
/// and returns its command line. Returns `None` in the server.
fn start(program: &OsString, request: Request) -> Option<Vec<OsString>> {
    let id = request.id;
    let threads = std::fs::read_dir("/proc/self/task").map_or(0, Iterator::count);
    if threads != 1 {
        reply(&format!(
            "error {id} the fork server has {threads} threads; forking it is not safe"
        ));
        return None;
    }
    // SAFETY: this process is single-threaded (checked above), so the child may run any code.
    match unsafe { libc::fork() } {
        -1 => {
            let e = std::io::Error::last_os_error();
            reply(&format!("error {id} fork: {e}"));
            None
        }
        0 => Some(waiter(program, request)),
        _ => None,
    }
}

/// The waiter: forks the command's process, replies its pid, waits for it and replies how it
/// ended, then exits. Returns only in the command's process.
fn waiter(program: &OsString, request: Request) -> Vec<OsString> {
    let id = request.id;
    // SAFETY: as in `start`: restores the default so that `waitpid` sees the child's end.
    unsafe { libc::signal(libc::SIGCHLD, libc::SIG_DFL) };
    // SAFETY: the waiter is single-threaded, a fork of the single-threaded server.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        return match command(program, &request) {
            Ok(args) => args,
            Err(e) => {
                // The caller sees it as the command's own failure.
                let _ = std::fs::write(&request.stderr, format!("error: fork server: {e}\n"));
                // SAFETY: ends this process at once, as a failed exec would.
                unsafe { libc::_exit(127) }
            }
        };
    }
    if pid == -1 {
        let e = std::io::Error::last_os_error();
        reply(&format!("error {id} fork: {e}"));
        // SAFETY: ends the waiter without running the server's exit handlers.
        unsafe { libc::_exit(0) }
    }
    reply(&format!("pid {id} {pid}"));
    let mut status: libc::c_int = 0;
    loop {
        // SAFETY: `status` is a valid place for waitpid to write to.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            break;
        }
        if r == -1 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            let e = std::io::Error::last_os_error();
            reply(&format!("error {id} waitpid: {e}"));
            // SAFETY: as above.
            unsafe { libc::_exit(0) }
        }
    }
    reply(&format!("exit {id} {status}"));
    // SAFETY: as above.
    unsafe { libc::_exit(0) }
}

/// In the command's process: its folder, environment and standard streams; returns its
/// command line.
fn command(program: &OsString, request: &Request) -> std::io::Result<Vec<OsString>> {
    std::env::set_current_dir(&request.cwd)?;
    for key in &request.remove {
        // SAFETY (of the environment change): this process is single-threaded.
        std::env::remove_var(key);
    }
    for (key, value) in &request.set {
        std::env::set_var(key, value);
    }
    redirect(0, "/dev/null".as_ref(), false)?;
    redirect(1, &request.stdout, true)?;
    redirect(2, &request.stderr, true)?;
    let mut args = vec![program.clone()];
    args.extend(request.args.iter().map(OsString::from));
    Ok(args)
}

/// Opens `path` (for writing, created and emptied, when `write`) as file descriptor `fd`.
fn redirect(fd: libc::c_int, path: &std::path::Path, write: bool) -> std::io::Result<()> {
    let name = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other("a path with a NUL byte"))?;
    let flags = if write {
        libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC
    } else {
        libc::O_RDONLY
    };
    // SAFETY: `name` is a NUL-terminated path; the descriptors are this process's own.
    unsafe {
        let opened = libc::open(name.as_ptr(), flags, 0o644);
        if opened == -1 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::dup2(opened, fd) == -1 {
            return Err(std::io::Error::last_os_error());
        }
        libc::close(opened);
    }
    Ok(())
}

/// Writes one reply line to stdout in one `write` (not through Rust's buffered stdout, whose
/// buffer a fork would copy).
fn reply(line: &str) {
    let text = format!("{line}\n");
    // SAFETY: writes bytes of a live buffer to file descriptor 1.
    unsafe { libc::write(1, text.as_ptr().cast(), text.len()) };
}
