#if canImport(Glibc)
    internal import Glibc
#elseif canImport(Darwin)
    internal import Darwin
#endif

/// The descriptors a spawned child would inherit, so a spawner can close them in the child: a
/// socket of ours held open by a long-lived child (pg_ctl's server, a `siwa dev` service, the
/// watchdog) keeps the connection open after we closed it, and the peer never sees the close.
/// glibc's `posix_spawn_file_actions_addclosefrom_np` would say it in one call, but Swift does not
/// see it here.
package enum InheritedDescriptors {
    /// This process's open descriptors above stderr (`/proc/self/fd`). One opened by another thread
    /// after this look is inherited still; one closed since is skipped by the child (glibc ignores
    /// EBADF for a close action).
    package static func aboveStandardError() -> [Int32] {
        guard let directory = opendir("/proc/self/fd") else { return [] }
        defer { closedir(directory) }
        let own = dirfd(directory)
        var descriptors: [Int32] = []
        while let entry = readdir(directory) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            if let descriptor = Int32(name), descriptor != own, descriptor > 2 { descriptors.append(descriptor) }
        }
        return descriptors
    }
}
