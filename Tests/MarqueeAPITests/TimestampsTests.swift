import Foundation
import Testing

@testable import MarqueeAPI

@Suite("Timestamps")
struct TimestampsTests {
    @Test("a date or time of day that does not exist is refused, never rolled over into another day")
    func nonexistentDates() {
        for bad in [
            "2031-02-29T00:00:00Z", "2100-02-29T00:00:00Z", "2027-02-30T00:00:00Z", "2027-04-31T00:00:00Z",
            "2027-13-01T00:00:00Z", "2027-00-10T00:00:00Z", "2027-01-00T00:00:00Z", "2027-01-01T24:00:00Z",
            "2027-01-01T00:60:00Z", "2027-01-01T00:00:60Z", "2027-01-01", "2027-01-01T00:00:00",
        ] {
            #expect(Timestamps.parse(bad) == nil, "\(bad)")
        }
        let good: [(String, TimeInterval)] = [
            ("2032-02-29T00:00:00Z", 1_961_625_600), ("2000-02-29T00:00:00Z", 951_782_400),
            ("2027-12-31T23:59:59.5Z", 1_830_297_599.5), ("2027-01-01T01:00:00+01:00", 1_798_761_600),
        ]
        for (text, seconds) in good {
            #expect(Timestamps.parse(text)?.timeIntervalSince1970 == seconds, "\(text)")
        }
    }
}
