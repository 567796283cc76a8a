import Foundation

/// The rules of one start, update or end, without I/O: given what a request asks and what the store read, what to
/// write, or why nothing is written. The API parses a request, reads the facts, asks the planner, writes the plan in
/// one statement and renders the answer; every lifecycle rule a single change obeys is here or one call away
/// (`ContentChange`, `StaleDateRule`, `NoOp`, `DeliverySnapshot`, `PayloadLimits`).
///
/// Client mistakes throw ``ValidationError`` (422) or ``PayloadSizeError`` (413).
public enum LifecyclePlanner {
    /// The operation of a change of an existing instance.
    public enum Operation: String, Sendable { case update, end }

    // MARK: Start

    /// A start as the client asked for it, parsed.
    public struct StartRequest: Sendable, Equatable {
        public var instanceID: String
        public var activityType: String
        public var attributes: JSONValue
        /// The content state as sent (dates not yet in the activity type's encoding).
        public var contentState: JSONValue
        /// Only devices of this platform.
        public var platform: Platform?
        /// Only this device.
        public var deviceID: String?
        /// The start's options, alert included.
        public var options: StoredOptions
        public var expiresAt: Date
        /// The broadcast channel the request names.
        public var channelID: UUID?

        public init(
            instanceID: String, activityType: String, attributes: JSONValue, contentState: JSONValue,
            platform: Platform? = nil, deviceID: String? = nil, options: StoredOptions, expiresAt: Date,
            channelID: UUID? = nil
        ) {
            self.instanceID = instanceID
            self.activityType = activityType
            self.attributes = attributes
            self.contentState = contentState
            self.platform = platform
            self.deviceID = deviceID
            self.options = options
            self.expiresAt = expiresAt
            self.channelID = channelID
        }
    }

    /// What the store read for a start.
    public struct StartFacts: Sendable, Equatable {
        /// The activity type the start names, if the tenant defined it.
        public var activityType: ActivityType?
        /// The person's devices, each with its push-to-start token for the activity type (iOS).
        public var candidates: [StartCandidate]
        /// Another instance already has the requested ID.
        public var instanceIDTaken: Bool
        /// The channel the start names, if it exists in this tenant.
        public var channel: ChannelRecord?

        public init(
            activityType: ActivityType?, candidates: [StartCandidate], instanceIDTaken: Bool = false,
            channel: ChannelRecord? = nil
        ) {
            self.activityType = activityType
            self.candidates = candidates
            self.instanceIDTaken = instanceIDTaken
            self.channel = channel
        }
    }

    /// A new instance and its first deliveries.
    public struct StartPlan: Sendable, Equatable {
        public var state: InstanceState
        public var failureReason: String?
        /// Validated, in device encoding.
        public var contentState: JSONValue
        public var options: StoredOptions
        /// The APNs `timestamp` of version 1.
        public var contentTimestamp: Int64
        public var deliveries: [PlannedDelivery]
        /// Android devices of the instance: they get its updates and end through their FCM token.
        public var androidDevices: [String]
        public var warnings: [String]
    }

    public enum StartDecision: Sendable, Equatable {
        case write(StartPlan)
        /// The instance ID is another instance's.
        case conflict
    }

    /// Plans a start. `newID` names each planned delivery (ULIDs in production, so they sort by time).
    public static func planStart(
        _ request: StartRequest, facts: StartFacts, now: Date, newID: () -> UUID
    ) throws -> StartDecision {
        if facts.instanceIDTaken { return .conflict }
        guard let type = facts.activityType else {
            throw ValidationError(
                field: "notification_type",
                reason: "is not a known activity type: define it with PUT /v1/activity_types/{identifier}")
        }
        if request.channelID != nil {
            guard let channel = facts.channel else {
                throw ValidationError(field: "channel_id", reason: "is not a channel of this tenant")
            }
            try channel.checkUsable(for: request.activityType)
        }
        let channel = request.channelID == nil ? nil : facts.channel
        let contentState = try ContentChange.replace(request.contentState).apply(
            to: .null, schema: type.contentStateSchema, dateFields: type.dateFields, profile: type.payloadProfile)
        var options = request.options
        let stale = StaleDateRule.apply(options.staleDate, now: now)
        options.staleDate = stale.staleDate

        // Targets: push-to-start tokens of the person's iOS devices, FCM tokens of their Android devices.
        var deliveries: [PlannedDelivery] = []
        var androidDevices: [String] = []
        for candidate in facts.candidates {
            if let platform = request.platform, candidate.platform != platform { continue }
            if let device = request.deviceID, candidate.deviceToken != device { continue }
            switch candidate.platform {
            case .ios:
                guard let token = candidate.pushToStartToken else { continue }
                deliveries.append(
                    PlannedDelivery(
                        id: newID(), deviceToken: candidate.deviceToken, provider: .apns, tokenKind: .pushToStart,
                        token: token))
            case .android:
                deliveries.append(
                    PlannedDelivery(
                        id: newID(), deviceToken: candidate.deviceToken, provider: .fcm, tokenKind: .fcm,
                        token: candidate.deviceToken))
                androidDevices.append(candidate.deviceToken)
            }
        }
        // Apple shows an alert when a live activity starts on iOS: a start that reaches an iPhone must carry one.
        let reachesIPhone =
            deliveries.contains { $0.provider == .apns } || (request.platform == .ios && deliveries.isEmpty)
        if options.alert == nil && reachesIPhone {
            throw ValidationError(
                .missingField, field: "push_payload.alert",
                reason: "is required to start on iOS: Apple shows an alert when a live activity starts")
        }
        let timestamp = Int64(now.timeIntervalSince1970.rounded(.down))
        // Exactly what each delivery will send (its snapshot), with the worst-case attribution.
        var content = DeliverySnapshot(
            attributes: request.attributes, contentState: contentState, options: options, timestamp: timestamp
        ).content(
            event: .start, instanceID: request.instanceID, activityType: request.activityType,
            attributesType: type.attributesType, profile: type.payloadProfile, dateFields: type.dateFields, now: now)
        content.inputPushChannel = channel?.apnsChannelID
        // Every platform the instance may have targets on, not only those it has now: the person's devices change
        // after the start (an iPhone-only person's Android phone would get its updates and end).
        var platforms = Set(startPlatforms(request.platform))
        if channel != nil { platforms.insert(.ios) }
        try checkSize(content, platforms: Array(platforms))

        // A channel-backed instance lives without push-to-start targets: apps subscribe to its channel themselves.
        let state: InstanceState = deliveries.isEmpty ? (channel != nil ? .active : .failed) : .pending
        return .write(
            StartPlan(
                state: state, failureReason: state == .failed ? "no_push_to_start_token" : nil,
                contentState: contentState, options: options, contentTimestamp: timestamp, deliveries: deliveries,
                androidDevices: androidDevices, warnings: stale.warnings))
    }

    // MARK: Update and end

    /// An update or end as the client asked for it, parsed.
    public struct ChangeRequest: Sendable, Equatable {
        public var operation: Operation
        /// The new content state: a whole one, a merge patch, or none (an end that keeps the state).
        public var content: ContentChange
        /// New attributes; nil keeps the instance's.
        public var attributes: JSONValue?
        /// The options the request sets, over the instance's sticky ones.
        public var options: OptionChanges
        public var alert: LiveActivityAlert?
        /// An end's dismissal.
        public var dismissal: Dismissal

        public init(
            operation: Operation, content: ContentChange, attributes: JSONValue? = nil,
            options: OptionChanges = OptionChanges(), alert: LiveActivityAlert? = nil, dismissal: Dismissal = .default
        ) {
            self.operation = operation
            self.content = content
            self.attributes = attributes
            self.options = options
            self.alert = alert
            self.dismissal = dismissal
        }
    }

    /// When iOS removes an ended activity from the lock screen.
    public enum Dismissal: Sendable, Equatable {
        /// iOS's default (up to four hours).
        case `default`
        /// At once.
        case immediate
        /// At this date.
        case at(Date)

        /// An end's `dismissal_policy` (`immediate` or `default`) or `dismissal_date`, not both: the one home of that
        /// rule, for an instance's end and a campaign's. iOS removes an ended activity at its dismissal date, or at
        /// once when that date has passed (ActivityKit's `after(_:)`: "any date"), so a date already past when the end
        /// is sent is kept and dismisses at once, as `immediate` does (and a client's clock a little ahead of ours
        /// does no harm). An end scheduled for `endsAt` (a campaign's `at`) refuses a date before it: that date
        /// would only ever dismiss at once, which is said with `dismissal_policy: immediate`, so it is a mistake.
        public init(policy: String?, date: Date?, endsAt: Date? = nil) throws(ValidationError) {
            if let policy, policy != "immediate", policy != "default" {
                throw ValidationError(field: "dismissal_policy", reason: "must be immediate or default")
            }
            if let date {
                if policy != nil {
                    throw ValidationError(field: "dismissal_policy", reason: "cannot be combined with dismissal_date")
                }
                if let endsAt, date < endsAt {
                    throw ValidationError(
                        field: "dismissal_date",
                        reason: "is before at, when the end is sent: use dismissal_policy immediate to dismiss at once")
                }
                self = .at(date)
            } else {
                self = policy == "immediate" ? .immediate : .default
            }
        }

        /// The dismissal date an end sent at `sentAt` carries (nil: the system's default).
        public func date(sentAt: Date) -> Date? {
            switch self {
            case .default: nil
            case .immediate: sentAt
            case .at(let date): date
            }
        }
    }

    /// Sticky options a change sets: what it names replaces the stored value, what it omits (or sends as null) is kept.
    public struct OptionChanges: Sendable, Equatable {
        public var deepLink: String?
        public var staleDate: Date?
        public var relevanceScore: Double?
        public var priority: Int?

        public init(
            deepLink: String? = nil, staleDate: Date? = nil, relevanceScore: Double? = nil, priority: Int? = nil
        ) {
            self.deepLink = deepLink
            self.staleDate = staleDate
            self.relevanceScore = relevanceScore
            self.priority = priority
        }

        /// `base` with these changes; the per-push fields (alert, dismissal) are cleared.
        public func applied(to base: StoredOptions) -> StoredOptions {
            var options = base
            options.alert = nil
            options.dismissalDate = nil
            if let deepLink { options.deepLink = deepLink }
            if let staleDate { options.staleDate = staleDate }
            if let relevanceScore { options.relevanceScore = relevanceScore }
            if let priority { options.priority = priority }
            return options
        }
    }

    /// What the store read for a change.
    public struct ChangeFacts: Sendable, Equatable {
        public var instance: InstanceRecord
        public var activityType: ActivityType
        /// The instance's active per-token targets.
        public var targets: [ActivityTarget]
        /// Its broadcast channel, if it is channel-backed.
        public var channel: ChannelBinding?

        public init(
            instance: InstanceRecord, activityType: ActivityType, targets: [ActivityTarget],
            channel: ChannelBinding? = nil
        ) {
            self.instance = instance
            self.activityType = activityType
            self.targets = targets
            self.channel = channel
        }
    }

    /// A new version of an instance and its deliveries, written only if the instance is still at `expectedVersion`.
    public struct ChangePlan: Sendable, Equatable {
        public var expectedVersion: Int
        public var state: InstanceState
        public var failureReason: String?
        public var attributes: JSONValue
        public var contentState: JSONValue
        public var options: StoredOptions
        /// The APNs `timestamp` of the new version: strictly after the previous one.
        public var contentTimestamp: Int64
        public var deliveries: [PlannedDelivery]
        public var warnings: [String]
        /// The version this plan writes: one after `expectedVersion`, or more when it carries several changes of one
        /// instance planned one on top of the other (``InstanceRecord/apply(_:operation:now:)``).
        public var version: Int
    }

    public enum ChangeDecision: Sendable, Equatable {
        case write(ChangePlan)
        /// An update that shows nothing new: nothing is written or sent.
        case noop(state: InstanceState, version: Int, warnings: [String])
        /// The instance is over; `markExpired` when it expired and the row does not say so yet.
        case closed(InstanceState, markExpired: Bool)
    }

    /// Plans an update or end of `facts.instance`.
    public static func planChange(
        _ request: ChangeRequest, facts: ChangeFacts, now: Date, newID: () -> UUID
    ) throws -> ChangeDecision {
        let instance = facts.instance
        let type = facts.activityType
        let effective = instance.effectiveState(now: now)
        if effective.isClosed {
            return .closed(effective, markExpired: effective == .expired && instance.state != .expired)
        }
        let current = StoredOptions(json: instance.options)
        var options = request.options.applied(to: current)
        options.alert = request.alert
        options.dismissalDate = request.dismissal.date(sentAt: now)
        // A stale date this request sets is checked (and reported); a stored one that has passed since is simply no
        // longer sent.
        var stale = StaleDateRule.Outcome(staleDate: options.staleDate.flatMap { $0 > now ? $0 : nil })
        if request.options.staleDate != nil { stale = StaleDateRule.apply(options.staleDate, now: now) }
        options.staleDate = stale.staleDate

        // The stored state is already in device encoding: a patch encodes only what it brings, then merges.
        let contentState = try request.content.apply(
            to: instance.contentState, schema: type.contentStateSchema, dateFields: type.dateFields,
            profile: type.payloadProfile)
        let attributes = request.attributes ?? instance.attributes
        if request.operation == .update,
            NoOp.isNoOp(
                current: ActivitySnapshot(
                    contentState: instance.contentState, attributes: instance.attributes,
                    options: current.activityOptions),
                next: ActivitySnapshot(
                    contentState: contentState, attributes: attributes, options: options.activityOptions),
                alert: request.alert)
        {
            return .noop(state: effective, version: instance.version, warnings: stale.warnings)
        }

        let timestamp = max(Int64(now.timeIntervalSince1970.rounded(.down)), instance.contentTimestamp + 1)
        // Exactly what each delivery will send (its snapshot), with the worst-case attribution.
        let content = DeliverySnapshot(
            attributes: attributes, contentState: contentState, options: options, timestamp: timestamp
        ).content(
            event: request.operation == .end ? .end : .update, instanceID: instance.id,
            activityType: instance.activityType, attributesType: type.attributesType, profile: type.payloadProfile,
            dateFields: type.dateFields, now: now)
        let channel = facts.channel.flatMap { $0.active ? $0 : nil }
        var platforms = Set(facts.targets.map(\.platform))
        if channel != nil { platforms.insert(.ios) }
        try checkSize(content, platforms: platforms.isEmpty ? [.ios, .android] : Array(platforms))

        var deliveries = facts.targets.map { target in
            PlannedDelivery(
                id: newID(), deviceToken: target.deviceToken, provider: target.platform == .ios ? .apns : .fcm,
                tokenKind: target.platform == .ios ? .activity : .fcm, token: target.token)
        }
        // A channel-backed instance: one broadcast for every device subscribed to the channel, beside the per-token
        // pushes of devices that could not subscribe (they registered an activity token instead).
        if let channel {
            deliveries.append(
                PlannedDelivery(
                    id: newID(), deviceToken: channel.deliveryDevice, provider: .apns,
                    tokenKind: .channel, token: channel.apnsChannelID))
        }
        let state: InstanceState
        var failureReason: String?
        if request.operation == .end {
            // Ended even with no activity token yet: the store keeps the end for a token that registers later.
            state = .ended
        } else if deliveries.isEmpty {
            state = .failed
            failureReason = facts.channel != nil ? "channel_gone" : "no_activity_token"
        } else {
            state = instance.state == .failed ? .pending : instance.state
        }
        return .write(
            ChangePlan(
                expectedVersion: instance.version, state: state, failureReason: failureReason, attributes: attributes,
                contentState: contentState, options: options, contentTimestamp: timestamp, deliveries: deliveries,
                warnings: stale.warnings, version: instance.version + 1))
    }

    /// The platforms a started instance may have targets on, so the platforms its pushes must fit: the one the start
    /// (or campaign) names, else both.
    public static func startPlatforms(_ platform: Platform?) -> [Platform] {
        platform.map { [$0] } ?? [.ios, .android]
    }

    /// The composed push must fit every platform it goes to.
    public static func checkSize(_ content: ActivityContent, platforms: [Platform]) throws(PayloadSizeError) {
        for platform in Set(platforms).sorted(by: { $0.rawValue > $1.rawValue }) {
            try PayloadLimits.check(content, platform: platform)
        }
    }
}

extension InstanceRecord {
    /// The instance as `plan` leaves it, so that the next change of the same instance can be planned on top of it
    /// before either is written.
    public mutating func apply(_ plan: LifecyclePlanner.ChangePlan, operation: LifecyclePlanner.Operation, now: Date) {
        state = plan.state
        failureReason = plan.failureReason
        attributes = plan.attributes
        contentState = plan.contentState
        options = plan.options.json
        version = plan.version
        contentTimestamp = plan.contentTimestamp
        if operation == .end { endedAt = now }
        updatedAt = now
    }
}
