// The KioskAuthProtocol module.
