import Foundation
import MarqueeCore
import Testing

/// The planner's decisions, without a database or a socket: what a start, update or end writes, or why it writes
/// nothing.
@Suite("Lifecycle planner")
struct LifecyclePlannerTests {
    static let now = Date(timeIntervalSince1970: 1_800_000_000)
    static let type = ActivityType(
        identifier: "delivery", attributesType: "DeliveryAttributes",
        contentStateSchema: .object([
            "type": .string("object"), "required": .array([.string("status")]),
            "properties": .object(["status": .object(["type": .string("string")])]),
        ]))
    static let alert = LiveActivityAlert(title: "Order", body: "On its way", sound: nil)

    /// Sequential delivery IDs, so plans compare exactly.
    final class IDs: @unchecked Sendable {
        var n: UInt8 = 0
        func next() -> UUID {
            n += 1
            return UUID(uuid: (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, n))
        }
    }

    static func startRequest(
        platform: Platform? = nil, deviceID: String? = nil, alert: LiveActivityAlert? = Self.alert,
        channelID: UUID? = nil, state: JSONValue = .object(["status": .string("packed")]),
        staleDate: Date? = nil
    ) -> LifecyclePlanner.StartRequest {
        LifecyclePlanner.StartRequest(
            instanceID: "order-1", activityType: "delivery", attributes: .object(["order": .string("42")]),
            contentState: state, platform: platform, deviceID: deviceID,
            options: StoredOptions(alert: alert, staleDate: staleDate), expiresAt: now.addingTimeInterval(3600),
            channelID: channelID)
    }

    static let iphone = StartCandidate(deviceToken: "ios-1", platform: .ios, pushToStartToken: "pts-1")
    static let iphoneWithoutToken = StartCandidate(deviceToken: "ios-2", platform: .ios, pushToStartToken: nil)
    static let pixel = StartCandidate(deviceToken: "fcm-1", platform: .android, pushToStartToken: nil)

    static func channel(status: String = "active", activityType: String = "delivery") -> ChannelRecord {
        ChannelRecord(
            id: UUID(uuid: (9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9)), activityType: activityType,
            storagePolicy: .none, apnsChannelID: "Y2hhbm5lbA==", bundleID: "com.example.app", environment: "sandbox",
            status: status, statusReason: status == "active" ? nil : "ChannelNotRegistered", createdAt: now,
            updatedAt: now)
    }

    static func start(_ request: LifecyclePlanner.StartRequest, _ facts: LifecyclePlanner.StartFacts) throws
        -> LifecyclePlanner.StartPlan
    {
        let ids = IDs()
        guard case .write(let plan) = try LifecyclePlanner.planStart(request, facts: facts, now: now, newID: ids.next)
        else {
            Issue.record("expected a plan")
            throw CancellationError()
        }
        return plan
    }

    @Test("a start goes to push-to-start tokens on iPhones and FCM tokens on Android, pending until delivered")
    func startTargets() throws {
        let plan = try Self.start(
            Self.startRequest(),
            .init(activityType: Self.type, candidates: [Self.iphone, Self.iphoneWithoutToken, Self.pixel]))
        #expect(plan.state == .pending)
        #expect(plan.failureReason == nil)
        #expect(plan.deliveries.map(\.tokenKind) == [.pushToStart, .fcm])
        #expect(plan.deliveries.map(\.token) == ["pts-1", "fcm-1"])
        #expect(plan.androidDevices == ["fcm-1"])
        #expect(plan.contentTimestamp == 1_800_000_000)
    }

    @Test("platform and device_id narrow the targets")
    func startFilters() throws {
        let facts = LifecyclePlanner.StartFacts(activityType: Self.type, candidates: [Self.iphone, Self.pixel])
        #expect(try Self.start(Self.startRequest(platform: .android), facts).deliveries.map(\.token) == ["fcm-1"])
        #expect(try Self.start(Self.startRequest(deviceID: "ios-1"), facts).deliveries.map(\.token) == ["pts-1"])
    }

    @Test("a start with nowhere to go is written as failed (no_push_to_start_token); on a channel it is active")
    func startWithoutTargets() throws {
        let failed = try Self.start(
            Self.startRequest(), .init(activityType: Self.type, candidates: [Self.iphoneWithoutToken]))
        #expect(failed.state == .failed)
        #expect(failed.failureReason == "no_push_to_start_token")
        let channel = Self.channel()
        let onChannel = try Self.start(
            Self.startRequest(channelID: channel.id), .init(activityType: Self.type, candidates: [], channel: channel))
        #expect(onChannel.state == .active)
        #expect(onChannel.deliveries.isEmpty)
    }

    @Test("a start that reaches an iPhone needs an alert; an Android-only start does not")
    func startAlert() throws {
        #expect(throws: ValidationError.self) {
            try Self.start(Self.startRequest(alert: nil), .init(activityType: Self.type, candidates: [Self.iphone]))
        }
        #expect(throws: ValidationError.self) {
            try Self.start(
                Self.startRequest(platform: .ios, alert: nil), .init(activityType: Self.type, candidates: []))
        }
        let plan = try Self.start(
            Self.startRequest(alert: nil), .init(activityType: Self.type, candidates: [Self.pixel]))
        #expect(plan.deliveries.count == 1)
    }

    @Test("unknown activity type, schema violation, unusable channel: 422 naming the field")
    func startRefusals() throws {
        func field(_ request: LifecyclePlanner.StartRequest, _ facts: LifecyclePlanner.StartFacts) -> String? {
            do {
                _ = try LifecyclePlanner.planStart(request, facts: facts, now: Self.now) { UUID() }
                return nil
            } catch let error as ValidationError {
                return error.field
            } catch {
                return "unexpected \(error)"
            }
        }
        #expect(field(Self.startRequest(), .init(activityType: nil, candidates: [Self.iphone])) == "notification_type")
        #expect(
            field(
                Self.startRequest(state: .object(["status": .int(3)])),
                .init(activityType: Self.type, candidates: [Self.iphone])) == "content_state/status")
        let request = Self.startRequest(channelID: Self.channel().id)
        #expect(field(request, .init(activityType: Self.type, candidates: [])) == "channel_id")
        #expect(
            field(request, .init(activityType: Self.type, candidates: [], channel: Self.channel(status: "gone")))
                == "channel_id")
        #expect(
            field(request, .init(activityType: Self.type, candidates: [], channel: Self.channel(activityType: "score")))
                == "channel_id")
    }

    @Test("a start whose push would not fit is refused with the provider's limit; a taken instance ID is a conflict")
    func startSizeAndConflict() throws {
        let big = Self.startRequest(state: .object(["status": .string(String(repeating: "x", count: 5000))]))
        #expect(throws: PayloadSizeError.self) {
            try Self.start(big, .init(activityType: Self.type, candidates: [Self.iphone]))
        }
        let decision = try LifecyclePlanner.planStart(
            Self.startRequest(),
            facts: .init(activityType: Self.type, candidates: [Self.iphone], instanceIDTaken: true),
            now: Self.now
        ) { UUID() }
        #expect(decision == .conflict)
    }

    @Test("a stale date already past is dropped with a warning")
    func startStaleDate() throws {
        let plan = try Self.start(
            Self.startRequest(staleDate: Self.now.addingTimeInterval(-1)),
            .init(activityType: Self.type, candidates: [Self.iphone]))
        #expect(plan.options.staleDate == nil)
        #expect(plan.warnings == [StaleDateRule.pastWarning])
    }

    // MARK: Changes

    static func instance(
        state: InstanceState = .active, expiresAt: Date = now.addingTimeInterval(3600), timestamp: Int64 = 1_900_000_000
    ) -> InstanceRecord {
        InstanceRecord(
            id: "order-1", activityType: "delivery", personID: "p1", personEmail: nil, state: state,
            failureReason: nil, attributes: .object(["order": .string("42")]),
            contentState: .object(["status": .string("packed")]), options: .object([:]), version: 3,
            contentTimestamp: timestamp, targetPlatform: nil, targetDevice: nil, expiresAt: expiresAt,
            startedAt: now.addingTimeInterval(-60), endedAt: nil, updatedAt: now, channelID: nil)
    }

    static let targets = [
        ActivityTarget(deviceToken: "ios-1", platform: .ios, token: "act-1"),
        ActivityTarget(deviceToken: "fcm-1", platform: .android, token: "fcm-1"),
    ]

    static func change(
        _ request: LifecyclePlanner.ChangeRequest, instance: InstanceRecord = instance(),
        targets: [ActivityTarget] = targets, channel: ChannelBinding? = nil
    ) throws -> LifecyclePlanner.ChangeDecision {
        try LifecyclePlanner.planChange(
            request, facts: .init(instance: instance, activityType: type, targets: targets, channel: channel),
            now: now, newID: IDs().next)
    }

    static let patch = LifecyclePlanner.ChangeRequest(
        operation: .update, content: .patch(.object(["status": .string("out_for_delivery")])))

    @Test("an update merges its patch, bumps the version, goes to every active token, timestamp strictly after")
    func update() throws {
        guard case .write(let plan) = try Self.change(Self.patch) else {
            Issue.record("expected a write")
            return
        }
        #expect(plan.expectedVersion == 3)
        #expect(plan.version == 4)
        #expect(plan.contentState == .object(["status": .string("out_for_delivery")]))
        #expect(plan.deliveries.map(\.tokenKind) == [.activity, .fcm])
        #expect(plan.state == .active)
        // The stored timestamp (1,900,000,000) is ahead of the clock: the new one still moves forward.
        #expect(plan.contentTimestamp == 1_900_000_001)
    }

    @Test("an update that changes nothing is a no-op; the same with an alert is sent")
    func noop() throws {
        let same = LifecyclePlanner.ChangeRequest(
            operation: .update, content: .patch(.object(["status": .string("packed")])))
        #expect(try Self.change(same) == .noop(state: .active, version: 3, warnings: []))
        var alerted = same
        alerted.alert = Self.alert
        guard case .write = try Self.change(alerted) else {
            Issue.record("an alert makes an update worth sending")
            return
        }
    }

    @Test("ended and expired instances are closed; an expiry the row does not record yet is marked")
    func closed() throws {
        #expect(
            try Self.change(Self.patch, instance: Self.instance(state: .ended)) == .closed(.ended, markExpired: false))
        #expect(
            try Self.change(Self.patch, instance: Self.instance(expiresAt: Self.now))
                == .closed(.expired, markExpired: true))
        #expect(
            try Self.change(Self.patch, instance: Self.instance(state: .expired))
                == .closed(.expired, markExpired: false))
    }

    @Test("an update with no token fails the instance (no_activity_token, or channel_gone); an end is kept")
    func noTargets() throws {
        guard case .write(let failed) = try Self.change(Self.patch, targets: []) else {
            Issue.record("expected a write")
            return
        }
        #expect(failed.state == .failed)
        #expect(failed.failureReason == "no_activity_token")
        let gone = ChannelBinding(
            id: UUID(), apnsChannelID: "Y2g=", storagePolicy: .none, bundleID: "b", active: false,
            environment: "sandbox", deliveryDevice: "channel:x")
        guard case .write(let lost) = try Self.change(Self.patch, targets: [], channel: gone) else {
            Issue.record("expected a write")
            return
        }
        #expect(lost.failureReason == "channel_gone")
        let end = LifecyclePlanner.ChangeRequest(operation: .end, content: .none, dismissal: .immediate)
        guard case .write(let ended) = try Self.change(end, targets: []) else {
            Issue.record("expected a write")
            return
        }
        #expect(ended.state == .ended)
        #expect(ended.options.dismissalDate == Self.now)
        #expect(ended.contentState == Self.instance().contentState)
    }

    @Test("a failed instance that gets a token back is pending again; a live channel adds one broadcast")
    func recoveryAndChannel() throws {
        guard case .write(let plan) = try Self.change(Self.patch, instance: Self.instance(state: .failed)) else {
            Issue.record("expected a write")
            return
        }
        #expect(plan.state == .pending)
        let channel = ChannelBinding(
            id: UUID(), apnsChannelID: "Y2g=", storagePolicy: .none, bundleID: "b", active: true,
            environment: "sandbox", deliveryDevice: "channel:01ABC")
        guard case .write(let broadcast) = try Self.change(Self.patch, targets: [], channel: channel) else {
            Issue.record("expected a write")
            return
        }
        #expect(broadcast.deliveries.map(\.tokenKind) == [.channel])
        #expect(broadcast.deliveries.first?.deviceToken == "channel:01ABC")
        #expect(broadcast.deliveries.first?.token == "Y2g=")
    }

    @Test("sticky options: what a change names replaces, what it omits is kept, the alert is per push")
    func options() throws {
        var stored = Self.instance()
        stored.options = StoredOptions(alert: Self.alert, deepLink: "app://a", relevanceScore: 1, priority: 10).json
        var request = Self.patch
        request.options = LifecyclePlanner.OptionChanges(relevanceScore: 2)
        guard case .write(let plan) = try Self.change(request, instance: stored) else {
            Issue.record("expected a write")
            return
        }
        #expect(plan.options.deepLink == "app://a")
        #expect(plan.options.relevanceScore == 2)
        #expect(plan.options.priority == 10)
        #expect(plan.options.alert == nil)
        // A stale date in the past that this request sets is reported.
        request.options = LifecyclePlanner.OptionChanges(staleDate: Self.now.addingTimeInterval(-5))
        guard case .write(let stale) = try Self.change(request) else {
            Issue.record("expected a write")
            return
        }
        #expect(stale.warnings == [StaleDateRule.pastWarning])
        // A stored one that has passed since is no longer sent, without a warning (openapi: the activity went stale
        // as asked).
        stored.options = StoredOptions(staleDate: Self.now.addingTimeInterval(-60)).json
        guard case .write(let passed) = try Self.change(Self.patch, instance: stored) else {
            Issue.record("expected a write")
            return
        }
        #expect(passed.options.staleDate == nil)
        #expect(passed.warnings.isEmpty)
    }

    @Test("a patch that breaks the schema or an oversized update is refused")
    func changeRefusals() throws {
        let bad = LifecyclePlanner.ChangeRequest(operation: .update, content: .patch(.object(["status": .int(1)])))
        #expect(throws: ValidationError.self) { try Self.change(bad) }
        let big = LifecyclePlanner.ChangeRequest(
            operation: .update, content: .patch(.object(["status": .string(String(repeating: "y", count: 5000))])))
        #expect(throws: PayloadSizeError.self) { try Self.change(big) }
    }
}
