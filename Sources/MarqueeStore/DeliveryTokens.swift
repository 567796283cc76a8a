import Crypto

/// Delivery tokens: HMAC-SHA256 of the delivery ID under the tenant's secret, base64url. Devices echo them when
/// reporting opens, so that opens cannot be forged for deliveries a device never received.
public enum DeliveryTokens {
    public static func make(deliveryID: String, secret: [UInt8]) -> String {
        Base64URL.encode(HMACSHA256.authenticationCode(key: secret, message: Array(deliveryID.utf8)))
    }

    public static func verify(_ presented: String, deliveryID: String, secret: [UInt8]) -> Bool {
        ConstantTime.equals(Array(presented.utf8), Array(make(deliveryID: deliveryID, secret: secret).utf8))
    }
}
