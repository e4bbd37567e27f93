// The KioskAuthIdentity module.
