// The KioskAuthCore module.
