// version.h — tool and schema versions, written into every output file.
#pragma once
#define MHC_VERSION "0.1.0"
#define MHC_SCHEMA_VERSION 1
