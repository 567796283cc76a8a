import Crypto
import HTTPServer
import MarqueeStore
import Observability
import PostgresClient

/// Every route of `marquee serve`: system, admin, app and SDK APIs, and the Customer.io-compatible ingest.
public struct MarqueeAPI: Sendable {
    let system: SystemRoutes
    let admin: AdminRoutes
    let credentials: CredentialRoutes
    let activityTypes: ActivityTypeRoutes
    let registry: RegistryRoutes
    let compat: CompatRoutes

    public init(
        pool: PostgresPool, migrator: Migrator, keyRing: SealingKeyRing, adminToken: String?,
        keyCacheTTL: Duration = .seconds(5), metrics: MetricsRegistry, logger: Logger
    ) {
        let database = TenantDatabase(pool: pool)
        let tenants = TenantStore(database: database, keyRing: keyRing)
        let registryStore = RegistryStore(database: database)
        let authenticator = Authenticator(tenants: tenants, adminToken: adminToken, cacheTTL: keyCacheTTL)
        system = SystemRoutes(pool: pool, migrator: migrator, metrics: metrics, logger: logger)
        admin = AdminRoutes(authenticator: authenticator, tenants: tenants)
        credentials = CredentialRoutes(
            authenticator: authenticator, credentials: CredentialStore(database: database, keyRing: keyRing))
        activityTypes = ActivityTypeRoutes(authenticator: authenticator, registry: registryStore)
        registry = RegistryRoutes(authenticator: authenticator, registry: registryStore, tenants: tenants)
        compat = CompatRoutes(
            authenticator: authenticator, registry: registryStore, tenants: tenants, metrics: metrics, logger: logger)
    }

    /// Adds every route to `router`.
    public func register(in router: inout Router) {
        system.register(in: &router)
        admin.register(in: &router)
        credentials.register(in: &router)
        activityTypes.register(in: &router)
        registry.register(in: &router)
        compat.register(in: &router)
    }
}
