/// The release of this build.
enum MarqueeVersion {
    static let current = "0.1.0"
}
