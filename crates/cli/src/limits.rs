//! The process's open-files limit. `serve` holds two sockets per open stream (its client's and
//! its model call's), and many systems start processes with a soft limit of 1,024: it raises
//! its soft limit to the hard one at start, as servers that hold many connections do.

/// Raises the soft open-files limit to the hard one (at most 2²⁰); returns `(before, after)`,
/// or `None` where the limit cannot be read or set.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn raise_open_files() -> Option<(u64, u64)> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit only writes the struct it is given, which lives here.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return None;
    }
    let before = limit.rlim_cur;
    // An unlimited hard limit cannot be the soft one for descriptors (the kernel caps them).
    let target = limit.rlim_max.min(1 << 20);
    if before < target {
        limit.rlim_cur = target;
        // SAFETY: setrlimit only reads the struct it is given.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
            return None;
        }
    }
    Some((before, limit.rlim_cur.max(before)))
}

/// Elsewhere the limit is left as the system set it.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn raise_open_files() -> Option<(u64, u64)> {
    None
}
