// The KioskAuthStore module.
