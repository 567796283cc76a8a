extension Duration {
    /// The duration in seconds, as a `Double` (for rates, backoffs and gauges).
    public var inSeconds: Double {
        Double(components.seconds) + Double(components.attoseconds) / 1e18
    }
}
