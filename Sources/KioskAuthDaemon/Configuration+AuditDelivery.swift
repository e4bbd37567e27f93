public import FoundationEssentials
public import KioskAuthCore
import KioskAuthIdentity

extension DaemonConfiguration {
    /// Delivery of the audit trail to the organisation's HTTP collector (off unless
    /// `[AuditDelivery] Endpoint` is set).
    public struct AuditDelivery: Sendable {
        /// Where batches are POSTed: `https://…`, or `http://` to loopback only. Empty: off.
        public var endpoint = ""
        /// Name of the file in `$CREDENTIALS_DIRECTORY` holding the bearer token; empty: none.
        public var tokenCredential = ""
        /// Most entries in one request.
        public var batchSize = 100
        /// The longest one request may take.
        public var requestTimeout: TimeInterval = 10
        /// First backoff after a failure; doubles up to `maximumBackoff`.
        public var initialBackoff: TimeInterval = 2
        /// Longest backoff, and the pause after the endpoint refused a batch.
        public var maximumBackoff: TimeInterval = 300

        /// Whether delivery is configured.
        public var isEnabled: Bool { !endpoint.isEmpty }

        /// The schedule's policy.
        public var policy: AuditDeliveryPolicy {
            AuditDeliveryPolicy(
                batchSize: batchSize, initialBackoff: .milliseconds(Int64(initialBackoff * 1000)),
                maximumBackoff: .milliseconds(Int64(maximumBackoff * 1000)))
        }
    }

    /// Sets one `[AuditDelivery]` key; returns false when the key is unknown.
    mutating func setAuditDeliveryKey(key: String, value: String) throws -> Bool {
        func seconds(_ value: String, _ range: ClosedRange<Double>) throws -> TimeInterval {
            guard let number = Double(value), number.isFinite, range.contains(number) else {
                throw ValueError(message: "expected a number of seconds in \(range.lowerBound)...\(range.upperBound)")
            }
            return number
        }
        switch key {
        case "Endpoint":
            if !value.isEmpty {
                guard let url = URL(string: value), let scheme = url.scheme?.lowercased(), url.host != nil else {
                    throw ValueError(message: "expected an https:// URL")
                }
                guard url.user == nil, url.password == nil else {
                    throw ValueError(
                        message: "the URL must not contain credentials: put a bearer token in TokenCredential=")
                }
                guard AuditEndpointClient.isAcceptable(url) else {
                    throw ValueError(
                        message: scheme == "http"
                            ? "plain http:// is allowed only to loopback (127.0.0.1, ::1, localhost): use https://"
                            : "expected an https:// URL")
                }
            }
            auditDelivery.endpoint = value
        case "TokenCredential":
            guard !value.contains("/"), value != ".", value != ".." else {
                throw ValueError(message: "expected the name of a file in $CREDENTIALS_DIRECTORY, not a path")
            }
            auditDelivery.tokenCredential = value
        case "BatchSize":
            guard let number = Int(value), (1...1000).contains(number) else {
                throw ValueError(message: "expected a whole number in 1...1000")
            }
            auditDelivery.batchSize = number
        case "RequestTimeoutSec": auditDelivery.requestTimeout = try seconds(value, 0.1...300)
        case "InitialBackoffSec": auditDelivery.initialBackoff = try seconds(value, 0.1...3600)
        case "MaximumBackoffSec": auditDelivery.maximumBackoff = try seconds(value, 1...86400)
        default: return false
        }
        return true
    }

    /// Builds the audit endpoint client's configuration, reading the token from its systemd
    /// credential. Nil when delivery is not configured; a problem is a start-up error.
    func makeAuditEndpointConfiguration(
        credentialsDirectory: String?
    ) throws(ValueError) -> AuditEndpointClient.Configuration? {
        let delivery = auditDelivery
        guard delivery.isEnabled else {
            if !delivery.tokenCredential.isEmpty {
                throw ValueError(message: "[AuditDelivery] TokenCredential is set but Endpoint is empty")
            }
            return nil
        }
        guard let url = URL(string: delivery.endpoint) else {
            throw ValueError(message: "[AuditDelivery] Endpoint is not a URL")
        }
        if delivery.maximumBackoff < delivery.initialBackoff {
            throw ValueError(message: "[AuditDelivery] MaximumBackoffSec is shorter than InitialBackoffSec")
        }
        var token: CredentialSecret?
        if !delivery.tokenCredential.isEmpty {
            let name = delivery.tokenCredential
            guard let directory = credentialsDirectory else {
                throw ValueError(
                    message:
                        "[AuditDelivery] TokenCredential=\(name) but $CREDENTIALS_DIRECTORY is not set (LoadCredentialEncrypted=\(name):… in the unit)"
                )
            }
            guard let data = FileManager.default.contents(atPath: directory + "/" + name) else {
                throw ValueError(
                    message: "[AuditDelivery] TokenCredential: cannot read credential \(name) in $CREDENTIALS_DIRECTORY"
                )
            }
            token = CredentialSecret(credentialBytes: data)
        }
        return AuditEndpointClient.Configuration(
            url: url, bearerToken: token, requestTimeout: .milliseconds(Int64(delivery.requestTimeout * 1000)))
    }
}
