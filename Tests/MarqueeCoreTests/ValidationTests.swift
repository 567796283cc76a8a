import Testing

@testable import MarqueeCore

@Suite("Identifier and token rules")
struct ValidationTests {
    @Test("APNs tokens: hex, 64 to 200 characters, stored lowercase")
    func apnsTokens() throws {
        let upper = String(repeating: "AB", count: 32)
        #expect(try Identifiers.apnsToken(upper, field: "t") == upper.lowercased())
        #expect(try Identifiers.apnsToken(String(repeating: "a", count: 200), field: "t").count == 200)
        for bad in [
            String(repeating: "a", count: 63), String(repeating: "a", count: 201), String(repeating: "g", count: 64),
            "",
        ] {
            #expect(throws: ValidationError.self) { try Identifiers.apnsToken(bad, field: "t") }
        }
        do {
            _ = try Identifiers.apnsToken("zz", field: "device_token")
        } catch {
            #expect(error.field == "device_token")
            #expect(error.code == .invalidToken)
            #expect(!error.reason.contains("zz"), "reasons never quote the token")
        }
    }

    @Test("FCM tokens: 1 to 1024 printable ASCII (longer ones cannot be indexed by PostgreSQL)")
    func fcmTokens() throws {
        #expect(try Identifiers.fcmToken("dGVzdA:APA91b-_x", field: "t") == "dGVzdA:APA91b-_x")
        #expect(try Identifiers.fcmToken(String(repeating: "x", count: 1024), field: "t").count == 1024)
        for bad in ["", String(repeating: "x", count: 1025), "has space", "tab\t", "é"] {
            #expect(throws: ValidationError.self) { try Identifiers.fcmToken(bad, field: "t") }
        }
    }

    @Test("device tokens by platform, and when the platform is not known")
    func deviceTokens() throws {
        let apns = String(repeating: "0f", count: 32)
        #expect(try Identifiers.deviceToken(apns, platform: .ios, field: "t") == apns)
        #expect(throws: ValidationError.self) { try Identifiers.deviceToken("fcm:token", platform: .ios, field: "t") }
        #expect(try Identifiers.deviceToken("fcm:token", platform: .android, field: "t") == "fcm:token")
        #expect(try Identifiers.anyDeviceToken(apns.uppercased(), field: "t") == apns)
        #expect(try Identifiers.anyDeviceToken("fcm:token", field: "t") == "fcm:token")
    }

    @Test("instance IDs", arguments: ["a", "order-42", "A.b_c:d-e", "...", ".a", String(repeating: "x", count: 128)])
    func goodInstanceIDs(id: String) throws {
        #expect(try Identifiers.instanceID(id) == id)
    }

    @Test(
        "bad instance IDs (. and .. are dropped from request paths: no route could name them)",
        arguments: ["", "has space", "slash/", String(repeating: "x", count: 129), "é", ".", ".."])
    func badInstanceIDs(id: String) {
        #expect(throws: ValidationError.self) { try Identifiers.instanceID(id) }
    }

    @Test("activity types are reverse-DNS")
    func activityTypes() throws {
        #expect(try Identifiers.activityType("com.example.delivery") == "com.example.delivery")
        #expect(try Identifiers.activityType("io.customer_1.live-score") == "io.customer_1.live-score")
        for bad in [
            "delivery", "com..x", ".com.x", "com.x.", "com.ex ample", String(repeating: "a.", count: 130) + "b",
        ] {
            #expect(throws: ValidationError.self) { try Identifiers.activityType(bad) }
        }
    }

    @Test("attributes types are Swift type names")
    func attributesTypes() throws {
        #expect(try Identifiers.attributesType("DeliveryAttributes") == "DeliveryAttributes")
        #expect(try Identifiers.attributesType("MyApp.Delivery_Attributes2") == "MyApp.Delivery_Attributes2")
        for bad in ["", "2Fast", "Has Space", "Trailing.", "A-B"] {
            #expect(throws: ValidationError.self) { try Identifiers.attributesType(bad) }
        }
    }

    @Test("person IDs reject control characters and overlong values")
    func personIDs() throws {
        #expect(try Identifiers.personID("user@example.com") == "user@example.com")
        #expect(try Identifiers.personID("名前") == "名前")
        #expect(throws: ValidationError.self) { try Identifiers.personID("") }
        #expect(throws: ValidationError.self) { try Identifiers.personID("a\nb") }
        #expect(throws: ValidationError.self) { try Identifiers.personID(String(repeating: "x", count: 257)) }
    }

    /// One of each kind of code point that makes an ID look like another (Cc, Cf, Zl, Zp, Co, default-ignorable,
    /// noncharacter), by name for the test's label.
    static let invisibleOrReordering: [(String, UInt32)] = [
        ("NEL (Cc)", 0x0085), ("zero-width space (Cf)", 0x200B), ("zero-width joiner (Cf)", 0x200D),
        ("left-to-right mark (Cf)", 0x200E), ("right-to-left mark (Cf)", 0x200F),
        ("Arabic letter mark (Cf)", 0x061C), ("right-to-left override (Cf)", 0x202E),
        ("left-to-right embedding (Cf)", 0x202A), ("first strong isolate (Cf)", 0x2068),
        ("pop directional isolate (Cf)", 0x2069), ("soft hyphen (Cf)", 0x00AD), ("BOM (Cf)", 0xFEFF),
        ("tag letter A (Cf)", 0xE0041), ("line separator (Zl)", 0x2028),
        ("paragraph separator (Zp)", 0x2029), ("private use (Co)", 0xE000),
        ("supplementary private use (Co)", 0xF0000), ("variation selector 16", 0xFE0F),
        ("Hangul filler", 0x3164), ("combining grapheme joiner", 0x034F), ("noncharacter U+FDD0", 0xFDD0),
        ("noncharacter U+FFFE", 0xFFFE), ("noncharacter U+1FFFF", 0x1FFFF),
    ]

    @Test("person IDs a write creates refuse invisible, formatting, direction-changing, private-use and noncharacters")
    func personIDsLookAlike() throws {
        for (name, value) in Self.invisibleOrReordering {
            // Built from its value: Swift refuses noncharacters in literals.
            let scalar = Unicode.Scalar(value)!
            let id = "alice" + String(Character(scalar)) + "1"
            #expect(throws: ValidationError.self, "\(name)") { try Identifiers.personID(id, field: "userId") }
            do {
                _ = try Identifiers.personID(id, field: "userId")
            } catch {
                #expect(error.field == "userId", "\(name)")
                #expect(error.code == .invalidField, "\(name)")
            }
            // Named by a read or a delete, it is accepted: people stored before the rule keep such IDs (controls were
            // refused before too).
            if scalar.properties.generalCategory != .control {
                #expect(try Identifiers.personReference(id) == id, "\(name)")
            }
        }
        // Visible text of any script, spaces, combining marks and emoji stay valid.
        for good in ["Zoë Smith", "cafe\u{301}", "名前", "עברית", "user+tag@example.com", "🦊"] {
            #expect(try Identifiers.personID(good) == good)
        }
        #expect(throws: ValidationError.self) { try Identifiers.personReference("a\nb") }
        #expect(throws: ValidationError.self) { try Identifiers.personReference("") }
    }

    @Test("lifecycle events that stop sends")
    func lifecycle() {
        #expect(LifecycleEvent.ended.stopsSends)
        #expect(LifecycleEvent.dismissed.stopsSends)
        #expect(!LifecycleEvent.started.stopsSends)
        #expect(!LifecycleEvent.stale.stopsSends)
    }
}

@Suite("API key text")
struct APIKeyTextTests {
    let tenantHex = "0123456789abcdef0123456789abcdef"

    @Test("round trip and tenant UUID")
    func roundTrip() throws {
        let key = APIKeyText(kind: .sdk, tenantHex: tenantHex, secret: "s3cr3t_s3cr3t-s3cr3t_abcdefghijkl")
        let parsed = try #require(APIKeyText(parsing: key.text))
        #expect(parsed == key)
        #expect(parsed.tenantUUIDString == "01234567-89ab-cdef-0123-456789abcdef")
        #expect(!key.hint.contains(key.secret))
    }

    @Test(
        "malformed keys do not parse",
        arguments: [
            "", "mq_app", "mq_root_0123456789abcdef0123456789abcdef_secretsecretsecretsecret",
            "xx_app_0123456789abcdef0123456789abcdef_secretsecretsecretsecret",
            "mq_app_0123456789abcdef_secretsecretsecretsecret",
            "mq_app_0123456789abcdef0123456789abcdeg_secretsecretsecretsecret",
            "mq_app_0123456789abcdef0123456789abcdef_short",
            "mq_app_0123456789abcdef0123456789abcdef_sec ret secret secret",
        ])
    func malformed(text: String) {
        #expect(APIKeyText(parsing: text) == nil)
    }
}
