// The KioskAuthDaemon module.
