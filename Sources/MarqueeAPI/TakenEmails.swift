import Foundation
import MarqueeCore
import MarqueeStore
import Observability

/// The one home of the rule that a person write with the public sdk key, not bound to a signed-in person, never tells
/// whether an email belongs to someone else.
///
/// A 409 "belongs to another person" to `PUT /v1/people/{id}` or a Customer.io `identify` let anyone holding the sdk
/// key (it ships inside the apps) test whether an address is a customer's. So when the tenant does not require
/// identity verification, such a write is answered as a success (to an sdk key that is `{id}` alone either way), the
/// rest of it is written, and the person keeps the email they had: the address is neither moved nor confirmed. It is
/// counted (`marquee_sdk_email_conflicts_total{route}`) and logged as a warning with the tenant and the person's ID,
/// never the email. App-key writes and identity-verified sdk-key writes (whose email the user token vouches for)
/// keep the 409.
struct TakenEmails: Sendable {
    let conflicts: Counter
    let logger: Logger

    init(metrics: MetricsRegistry, logger: Logger) {
        conflicts = metrics.counter(
            "marquee_sdk_email_conflicts_total",
            help: "sdk-key person writes without identity verification whose email belonged to another person: "
                + "answered as a success, the person's stored email kept.", labels: ["route"])
        self.logger = logger
    }

    /// What a person write by a key of `kind` under `verdict` does with an email another person has.
    static func policy(_ kind: APIKeyKind, _ verdict: IdentityGuard.Verdict) -> TakenEmail {
        guard kind == .sdk, case .unchecked = verdict.state else { return .conflict }
        return .keepStored
    }

    /// Records a write of `person` whose email was kept (`route`: `people` or `customerio`), after its commit.
    func kept(tenant: UUID, person: String, route: String, requestID: String) {
        conflicts.inc(1, [route])
        logger.warning(
            "sdk email conflict: person written, stored email kept",
            metadata: [
                "tenant.id": .string(tenant.uuidString.lowercased()), "person.id": .string(person),
                "http.route": .string(route), "request.id": .string(requestID),
            ])
    }
}
