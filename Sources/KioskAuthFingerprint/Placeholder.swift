// The KioskAuthFingerprint module.
