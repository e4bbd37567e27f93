#include "kioskauth_system.h"
