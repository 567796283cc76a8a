import Crypto
import Foundation
import HTTPServer
import MarqueeCore
import MarqueeStore
import Observability
import PostgresClient

/// Every route of `marquee serve`: system, admin, app and SDK APIs, the Customer.io-compatible ingest, and the
/// operator console's static files.
public struct MarqueeAPI: Sendable {
    let system: SystemRoutes
    let admin: AdminRoutes
    let credentials: CredentialRoutes
    let activityTypes: ActivityTypeRoutes
    let registry: RegistryRoutes
    let compat: CompatRoutes
    let lifecycle: LifecycleRoutes
    let settings: SettingsRoutes
    let channels: ChannelRoutes
    let segments: SegmentRoutes
    let peopleImport: PeopleImportRoutes
    let campaigns: CampaignRoutes
    let overview: OverviewRoutes
    let console: ConsoleRoutes
    let logger: Logger
    /// The group committer of lifecycle writes (exposed for metrics).
    public let committer: GroupCommitter

    /// Sent with every response of `marquee serve` that does not set them itself (`HTTPServer.Configuration
    /// .defaultHeaders`). Answers carry a tenant's data, much of it written by parties who are not the tenant (sdk
    /// keys are public; providers answer what they like): no cache, the browser's or a proxy's, keeps a copy, and no
    /// browser reads one as anything but its declared type. The console's files set their own (`ConsoleRoutes`).
    public static let responseHeaders: HTTPHeaders = [
        "Cache-Control": "no-store",
        "X-Content-Type-Options": "nosniff",
    ]

    public init(
        pool: PostgresPool, migrator: Migrator, keyRing: SealingKeyRing, adminToken: String?,
        keyCacheTTL: Duration = .seconds(5), requestLimits: RequestLimits,
        groupCommit: GroupCommitter.Configuration = .init(), readBatches: Int = 2,
        providerHosts: ProviderHosts = .standard, channelManager: (any BroadcastChannelManaging)? = nil,
        metrics: MetricsRegistry, logger: Logger
    ) {
        self.logger = logger
        let database = TenantDatabase(pool: pool)
        let tenants = TenantStore(database: database, keyRing: keyRing)
        let registryStore = RegistryStore(database: database)
        let authenticator = Authenticator(
            tenants: tenants, adminToken: adminToken, cacheTTL: keyCacheTTL,
            rateGuard: RequestRateGuard(limits: requestLimits, metrics: metrics, logger: logger))
        let settingsStore = TenantSettingsStore(database: database, keyRing: keyRing)
        let identity = IdentityGuard(settings: settingsStore, cacheTTL: keyCacheTTL)
        system = SystemRoutes(pool: pool, migrator: migrator, metrics: metrics, logger: logger)
        admin = AdminRoutes(authenticator: authenticator, tenants: tenants)
        credentials = CredentialRoutes(
            authenticator: authenticator, credentials: CredentialStore(database: database, keyRing: keyRing),
            providerHosts: providerHosts)
        activityTypes = ActivityTypeRoutes(authenticator: authenticator, registry: registryStore)
        let takenEmails = TakenEmails(metrics: metrics, logger: logger)
        registry = RegistryRoutes(
            authenticator: authenticator, registry: registryStore, tenants: tenants, identity: identity,
            takenEmails: takenEmails)
        compat = CompatRoutes(
            authenticator: authenticator, registry: registryStore, tenants: tenants, identity: identity,
            takenEmails: takenEmails, metrics: metrics, logger: logger)
        settings = SettingsRoutes(
            authenticator: authenticator, settings: settingsStore, identity: identity, limits: requestLimits)
        channels = ChannelRoutes(
            authenticator: authenticator, store: ChannelStore(database: database), manager: channelManager,
            logger: logger, now: { Date() })
        segments = SegmentRoutes(authenticator: authenticator, store: SegmentStore(database: database))
        peopleImport = PeopleImportRoutes(authenticator: authenticator, store: PeopleImportStore(database: database))
        campaigns = CampaignRoutes(
            authenticator: authenticator,
            store: CampaignStore(database: database, notifyChannel: groupCommit.notifyChannel ?? "marquee_deliveries"),
            registry: registryStore, segments: SegmentStore(database: database),
            channels: ChannelStore(database: database), channelRoutes: channels, now: { Date() })
        overview = OverviewRoutes(
            authenticator: authenticator, store: OverviewStore(database: database), now: { Date() })
        console = ConsoleRoutes()
        let batchSizes = metrics.histogram(
            "marquee_group_commit_batch_size", help: "Requests per transaction of the lifecycle group committer.",
            buckets: [1, 2, 4, 8, 16, 32, 64, 128, 256])
        committer = GroupCommitter(pool: pool, configuration: groupCommit) { batchSizes.observe(Double($0)) }
        let contextBatchSizes = metrics.histogram(
            "marquee_change_context_batch_size",
            help: "Updates and ends whose change contexts were read together, in one transaction.",
            buckets: [1, 2, 4, 8, 16, 32, 64])
        lifecycle = LifecycleRoutes(
            authenticator: authenticator,
            store: LiveActivityStore(database: database, committer: committer, readBatches: readBatches) {
                contextBatchSizes.observe(Double($0))
            },
            now: { Date() })
        let statistics = committer
        let batches = metrics.counter(
            "marquee_group_commit_batches_total", help: "Transactions committed by the lifecycle group committer.")
        let statements = metrics.counter(
            "marquee_group_commit_statements_total", help: "Requests committed through the group committer.")
        let inDoubt = metrics.counter(
            "marquee_group_commit_in_doubt_total",
            help: "Group-commit transactions whose connection was lost with COMMIT in flight, by what was learned.",
            labels: ["outcome"])
        metrics.onCollect {
            let s = statistics.statistics
            batches.inc(Double(s.batches) - batches.value())
            statements.inc(Double(s.statements) - statements.value())
            for (outcome, count) in [
                ("committed", s.inDoubtCommitted), ("aborted", s.inDoubtAborted), ("unknown", s.inDoubtUnknown),
            ] {
                inDoubt.inc(Double(count) - inDoubt.value([outcome]), [outcome])
            }
        }
    }

    /// Adds every route to `router`, each behind the problem renderer: a domain error (validation, not found,
    /// conflict, a database outage) becomes its problem document whatever the handler, so no route can forget it.
    public func register(in router: inout Router) {
        system.register(in: &router)
        admin.register(in: &router)
        credentials.register(in: &router)
        activityTypes.register(in: &router)
        registry.register(in: &router)
        compat.register(in: &router)
        lifecycle.register(in: &router)
        settings.register(in: &router)
        channels.register(in: &router)
        segments.register(in: &router)
        peopleImport.register(in: &router)
        campaigns.register(in: &router)
        overview.register(in: &router)
        console.register(in: &router)
        router.wrapHandlers { [logger] in guarded($0, logger: logger) }
    }
}
