package migrations

// LegacyOwners exposes legacyOwners to the tests.
var LegacyOwners = legacyOwners
