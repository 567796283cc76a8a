import Foundation
import Testing

@testable import MarqueeCore

@Suite("Stale date, lifetime and no-op rules")
struct ActivityRulesTests {
    let now = Date(timeIntervalSince1970: 1_740_000_000)

    @Test("a stale date at or before now is dropped with a warning; a future one is kept")
    func staleDate() {
        let past = StaleDateRule.apply(now.addingTimeInterval(-60), now: now)
        #expect(past.staleDate == nil)
        #expect(past.warnings == ["stale_date_in_past"])
        #expect(StaleDateRule.apply(now, now: now).warnings == ["stale_date_in_past"])
        let future = StaleDateRule.apply(now.addingTimeInterval(1), now: now)
        #expect(future.staleDate == now.addingTimeInterval(1))
        #expect(future.warnings.isEmpty)
        #expect(StaleDateRule.apply(nil, now: now) == StaleDateRule.Outcome(staleDate: nil, warnings: []))
    }

    @Test("expiration: at most 8 hours ahead, never in the past, 8 hours by default")
    func lifetime() throws {
        try Lifetime.validateExpiration(now.addingTimeInterval(8 * 3600), now: now)
        let error = #expect(throws: ValidationError.self) {
            try Lifetime.validateExpiration(now.addingTimeInterval(8 * 3600 + 1), now: now)
        }
        #expect(error?.field == "expires_at")
        #expect(throws: ValidationError.self) { try Lifetime.validateExpiration(now, now: now) }
        #expect(throws: ValidationError.self) {
            try Lifetime.validateExpiration(now.addingTimeInterval(-1), now: now, field: "end_by")
        }
        #expect(try Lifetime.expiration(requested: nil, now: now) == now.addingTimeInterval(28_800))
        let requested = now.addingTimeInterval(600)
        #expect(try Lifetime.expiration(requested: requested, now: now) == requested)
        #expect(throws: ValidationError.self) {
            try Lifetime.expiration(requested: now.addingTimeInterval(3601), now: now, maximum: 3600)
        }
    }

    var current: ActivitySnapshot {
        ActivitySnapshot(
            contentState: try! JSONValue.parse(#"{"title":"On the way","progress":0.5,"driver":{"name":"Ana"}}"#),
            attributes: .object(["orderNumber": .string("1234")]),
            options: ActivityOptions(
                staleDate: now.addingTimeInterval(3600), relevanceScore: 0.5, priority: .high,
                deepLink: "example://o/1234"))
    }

    @Test("an update whose merged state, attributes and options are unchanged, without alert, is a no-op")
    func noOpTrue() throws {
        let same = try JSONValue.parse(#"{"progress":0.50,"driver":{"name":"Ana"}}"#)
        #expect(NoOp.isNoOp(current: current, patch: same, options: current.options, alert: nil))
        #expect(NoOp.isNoOp(current: current, patch: .object([:]), options: current.options, alert: nil))
        // Deleting a field that is not there changes nothing either.
        let deleteAbsent = try JSONValue.parse(#"{"subtitle":null}"#)
        #expect(NoOp.isNoOp(current: current, patch: deleteAbsent, options: current.options, alert: nil))
        // Sub-second differences in the stale date do not reach the payload.
        var options = current.options
        options.staleDate = now.addingTimeInterval(3600.4)
        #expect(NoOp.isNoOp(current: current, patch: .object([:]), options: options, alert: nil))
        #expect(NoOp.isNoOp(current: current, next: current, alert: nil))
    }

    @Test("state, attribute or option changes, or an alert, make an update worth sending")
    func noOpFalse() throws {
        let options = current.options
        #expect(
            !NoOp.isNoOp(
                current: current, patch: try JSONValue.parse(#"{"progress":0.6}"#), options: options, alert: nil))
        #expect(
            !NoOp.isNoOp(
                current: current, patch: try JSONValue.parse(#"{"driver":{"name":null}}"#), options: options,
                alert: nil))
        #expect(
            !NoOp.isNoOp(
                current: current, patch: .object([:]), attributes: .object(["orderNumber": .string("9")]),
                options: options, alert: nil))
        var changed = options
        changed.staleDate = now.addingTimeInterval(7200)
        #expect(!NoOp.isNoOp(current: current, patch: .object([:]), options: changed, alert: nil))
        changed = options
        changed.relevanceScore = 0.9
        #expect(!NoOp.isNoOp(current: current, patch: .object([:]), options: changed, alert: nil))
        changed = options
        changed.priority = .normal
        #expect(!NoOp.isNoOp(current: current, patch: .object([:]), options: changed, alert: nil))
        changed = options
        changed.deepLink = nil
        #expect(!NoOp.isNoOp(current: current, patch: .object([:]), options: changed, alert: nil))
        #expect(
            !NoOp.isNoOp(
                current: current, patch: .object([:]), options: options,
                alert: LiveActivityAlert(title: "Hi", body: "Still on the way")))
    }
}
