import Locking

#if canImport(Glibc)
    internal import Glibc
#elseif canImport(Darwin)
    internal import Darwin
#endif

/// Makes sure what this process starts dies with it, however it ends (SIGKILL included): a small
/// watchdog process reads, on a pipe only this process can write to, what to clean up (child pids,
/// throwaway clusters, temporary folders). When the pipe closes, which the kernel does as this
/// process dies, the watchdog stops every child still registered (SIGTERM, SIGKILL after 1 s), stops each
/// cluster with `pg_ctl stop -m immediate` (pg_ctl's server is not our child: no parent-death signal
/// reaches it) and deletes the folders. An orderly stop forgets each thing as it is cleaned up, so
/// the watchdog then has nothing left to do. `siwa dev` and the test suite share it.
package final class OrphanReaper: Sendable {
    /// Started on first use; nil when the watchdog cannot be started (then cleanup is the owner's
    /// orderly stop alone).
    package static let shared: OrphanReaper? = try? OrphanReaper()

    /// The pid of the watchdog (tests look for it).
    package let watchdogPID: Int32
    /// Our end of the pipe, close-on-exec so no child of ours holds it open.
    private let writeEnd: Int32
    private let writing = Locked(0)

    private let watchdog: ChildProcess

    private init() throws(ChildProcessError) {
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else { throw ChildProcessError("pipe failed: errno \(errno)") }
        let (readEnd, writeEnd) = (fds[0], fds[1])
        _ = fcntl(readEnd, F_SETFD, FD_CLOEXEC)
        _ = fcntl(writeEnd, F_SETFD, FD_CLOEXEC)
        defer { close(readEnd) }
        do {
            // Its own process group: the terminal's Ctrl-C or hang-up reaches the owner, not the
            // watchdog. Not watched by itself, and never reaped: it lives as long as we do.
            watchdog = try ChildProcess(
                "/bin/bash", ["-c", Self.script, "siwa-orphan-reaper"],
                options: .init(input: .descriptor(readEnd), ownProcessGroup: true, diesWithUs: false))
        } catch {
            close(writeEnd)
            throw error
        }
        watchdogPID = watchdog.pid
        self.writeEnd = writeEnd
    }

    package func watch(pid: Int32) { send("pid \(pid)") }
    package func forget(pid: Int32) { send("unpid \(pid)") }
    package func watch(folder: String) { send("dir \(folder)") }
    package func forget(folder: String) { send("undir \(folder)") }

    /// A cluster in `directory` (data in `directory/data`), stopped with `pgCtl` run as `user`.
    package func watch(clusterIn directory: String, pgCtl: String, user: String?) {
        send("pgctl \(pgCtl)")
        send("pguser \(user ?? "")")
        send("pg \(directory)")
    }

    package func forget(clusterIn directory: String) { send("unpg \(directory)") }

    private func send(_ line: String) {
        // Paths with a newline cannot be told apart from two lines: such a folder is not watched.
        guard !line.contains("\n") else { return }
        let bytes = Array((line + "\n").utf8)
        writing.withLock { _ in
            var offset = 0
            while offset < bytes.count {
                let written = bytes[offset...].withUnsafeBytes { write(writeEnd, $0.baseAddress, $0.count) }
                if written < 0 && errno == EINTR { continue }
                if written <= 0 { return }  // the watchdog is gone: nothing more to tell it
                offset += written
            }
        }
    }

    /// The watchdog. Ignores the signals a terminal sends, closes every descriptor it inherited
    /// besides the three standard ones (a pipe end held here would keep someone else's reader
    /// waiting), then reads instructions until the owner's end closes.
    private static let script = #"""
        trap '' INT HUP TERM PIPE QUIT
        for fd in /proc/$$/fd/*; do fd=${fd##*/}; [[ $fd -gt 2 ]] && eval "exec $fd>&-"; done 2>/dev/null
        # A pid is kept with its start time (field 22 of /proc/PID/stat): pids are reused within
        # minutes on a busy machine, and a signal must never reach a process that merely got the number.
        started() { local stat; stat=$(< "/proc/$1/stat") 2>/dev/null || return 1; set -- ${stat##*) }; echo "${20}"; }
        same() { [[ $(started "$1") == "${pids[$1]}" ]]; }
        declare -A pids=() clusters=() folders=()
        pgctl= pguser=
        while IFS= read -r line; do
            kind=${line%% *}; value=${line#* }
            case $kind in
                pid) pids[$value]=$(started "$value") || unset "pids[$value]" ;;
                unpid) unset "pids[$value]" ;;
                pgctl) pgctl=$value ;;
                pguser) pguser=$value ;;
                pg) clusters[$value]=1 ;;
                unpg) unset "clusters[$value]" ;;
                dir) folders[$value]=1 ;;
                undir) unset "folders[$value]" ;;
            esac
        done
        for p in "${!pids[@]}"; do same "$p" && kill -TERM "$p" 2>/dev/null; done
        # The clusters stop meanwhile: nothing waits on them, and pg_ctl is slow on a busy machine.
        for d in "${!clusters[@]}"; do
            {
                if [[ -n $pguser ]]; then
                    runuser -u "$pguser" -- "$pgctl" -D "$d/data" -m immediate -w -t 10 stop
                else
                    "$pgctl" -D "$d/data" -m immediate -w -t 10 stop
                fi
                rm -rf -- "$d"
            } &
        done
        for _ in $(seq 10); do
            alive=
            for p in "${!pids[@]}"; do same "$p" && alive=1; done
            [[ -z $alive ]] && break
            sleep 0.1
        done
        for p in "${!pids[@]}"; do same "$p" && kill -KILL "$p" 2>/dev/null; done
        wait
        for d in "${!folders[@]}"; do rm -rf -- "$d"; done
        """#
}

/// `$TMPDIR` without a trailing slash, else `/tmp`: where throwaway folders and files go.
package func temporaryFolder() -> String {
    guard let value = getenv("TMPDIR").map({ String(cString: $0) }), !value.isEmpty else { return "/tmp" }
    return value.count > 1 && value.hasSuffix("/") ? String(value.dropLast()) : value
}
