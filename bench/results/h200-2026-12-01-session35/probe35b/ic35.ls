.:
total 36
drwxrwxrwt 3 root root 4096 14:47:22 ..
drwxr-xr-x 2 root root 4096 14:45:35 lc
drwxr-xr-x 9 root root 4096 14:45:35 .
drwxr-xr-x 2 root root 4096 14:45:35 iv
drwxr-xr-x 2 root root 4096 14:45:35 2g
drwxr-xr-x 3 root root 4096 14:45:35 triton
drwxr-xr-x 2 root root 4096 14:45:35 l5
drwxr-xr-x 2 root root 4096 14:45:35 yj
drwxr-xr-x 2 root root 4096 14:44:05 cache

./lc:
total 24
drwxr-xr-x 2 root root  4096 14:45:35 .
-rw-r--r-- 1 root root 16253 14:45:35 clcvok6qzlq6gmicm2dpfmhsgrumnkw666s4loeyju6ab7qswwdl.py
drwxr-xr-x 9 root root  4096 14:45:35 ..

./iv:
total 12
drwxr-xr-x 9 root root 4096 14:45:35 ..
drwxr-xr-x 2 root root 4096 14:45:35 .
-rw-r--r-- 1 root root 2253 14:45:35 civo5zwvfw46kebjkkqpjje5klew32uij6i5tb6w75vqhpqd4rix.py

./2g:
total 16
drwxr-xr-x 9 root root 4096 14:45:35 ..
drwxr-xr-x 2 root root 4096 14:45:35 .
-rw-r--r-- 1 root root 5839 14:45:35 c2g3zmesa62ym5xqes35pg433yrdpkjvppyzubluoli2j73mlozv.py

./triton:
total 12
drwxr-xr-x 10 root root 4096 14:45:38 0
drwxr-xr-x  9 root root 4096 14:45:35 ..
drwxr-xr-x  3 root root 4096 14:45:35 .

./triton/0:
total 40
drwxr-xr-x  2 root root 4096 14:47:22 ECCXWXI6EVBR2SZYDPPVGSABVNA4KTD6ZK5E4TLJP2UB267I7JAQ
drwxr-xr-x 10 root root 4096 14:45:38 .
drwxr-xr-x  2 root root 4096 14:45:38 ECQWL23G4UV4CHZUBPKEEDLTRAZRCGGKIICZJSVUR5B3YIHUUFWQ
drwxr-xr-x  2 root root 4096 14:45:35 ZRVLBYOAQIU6FW4AC2RC4IA2KBPMJK3LHZSA33I7ITXCHLMB4S7Q
drwxr-xr-x  2 root root 4096 14:45:35 GUQGDYVCFHKBXZVS6YTTK376B5REBCX5AVZOU4GSCHHFL373RXJA
drwxr-xr-x  2 root root 4096 14:45:35 EWE4MJ43HOH7ESTXQZP5T6WKIHZVEHXNEYRKUNP2WE2FPGBSON5A
drwxr-xr-x  2 root root 4096 14:45:35 FOACIACBAWZM6JUP45K3XXR3FOZNQQK7LBYTYM3E4WY5ECDVKZEQ
drwxr-xr-x  2 root root 4096 14:45:35 6Y4WMALOQ2BSCB4TL5RGGN77IKZSW4MTDWMEIPNINV2UXDSC33BQ
drwxr-xr-x  2 root root 4096 14:45:35 T5L6I52ZUBHI5GJRKR7OFJLCNYWA2WHE7QPQJG6O3WHXT5YRAPSQ
drwxr-xr-x  3 root root 4096 14:45:35 ..

./triton/0/ECCXWXI6EVBR2SZYDPPVGSABVNA4KTD6ZK5E4TLJP2UB267I7JAQ:
total 16308
drwxr-xr-x  2 root root    4096 14:47:22 .
-rw-r--r--  1 root root 9071964 14:47:22 triton_red_fused_3.ptx
-rw-r--r--  1 root root 6966356 14:47:12 triton_red_fused_3.llir
-rw-r--r--  1 root root  246256 14:45:40 triton_red_fused_3.ttgir
-rw-r--r--  1 root root  212171 14:45:39 triton_red_fused_3.ttir
-rw-r--r--  1 root root  187029 14:45:39 triton_red_fused_3.source
drwxr-xr-x 10 root root    4096 14:45:38 ..

./triton/0/ECQWL23G4UV4CHZUBPKEEDLTRAZRCGGKIICZJSVUR5B3YIHUUFWQ:
total 1692
drwxr-xr-x 10 root root   4096 14:45:38 ..
drwxr-xr-x  2 root root   4096 14:45:38 .
-rw-r--r--  1 root root    905 14:45:38 __grp__triton_red_fused_3.json
-rw-r--r--  1 root root   1119 14:45:38 triton_red_fused_3.json
-rw-r--r--  1 root root 284960 14:45:38 triton_red_fused_3.cubin
-rw-r--r--  1 root root 490265 14:45:38 triton_red_fused_3.ptx
-rw-r--r--  1 root root 325632 14:45:38 triton_red_fused_3.llir
-rw-r--r--  1 root root 234842 14:45:37 triton_red_fused_3.ttgir
-rw-r--r--  1 root root 201644 14:45:35 triton_red_fused_3.ttir
-rw-r--r--  1 root root 163973 14:45:35 triton_red_fused_3.source

./triton/0/ZRVLBYOAQIU6FW4AC2RC4IA2KBPMJK3LHZSA33I7ITXCHLMB4S7Q:
total 52
drwxr-xr-x 10 root root 4096 14:45:38 ..
drwxr-xr-x  2 root root 4096 14:45:35 .
-rw-r--r--  1 root root  905 14:45:35 __grp__triton_poi_fused_2.json
-rw-r--r--  1 root root 1115 14:45:35 triton_poi_fused_2.json
-rw-r--r--  1 root root 6224 14:45:35 triton_poi_fused_2.cubin
-rw-r--r--  1 root root 4972 14:45:35 triton_poi_fused_2.ptx
-rw-r--r--  1 root root 3054 14:45:35 triton_poi_fused_2.llir
-rw-r--r--  1 root root 4032 14:45:35 triton_poi_fused_2.ttgir
-rw-r--r--  1 root root 3614 14:45:35 triton_poi_fused_2.ttir
-rw-r--r--  1 root root 4609 14:45:35 triton_poi_fused_2.source

./triton/0/GUQGDYVCFHKBXZVS6YTTK376B5REBCX5AVZOU4GSCHHFL373RXJA:
total 52
drwxr-xr-x 10 root root 4096 14:45:38 ..
drwxr-xr-x  2 root root 4096 14:45:35 .
-rw-r--r--  1 root root  905 14:45:35 __grp__triton_poi_fused_2.json
-rw-r--r--  1 root root 1115 14:45:35 triton_poi_fused_2.json
-rw-r--r--  1 root root 6352 14:45:35 triton_poi_fused_2.cubin
-rw-r--r--  1 root root 5074 14:45:35 triton_poi_fused_2.ptx
-rw-r--r--  1 root root 3481 14:45:35 triton_poi_fused_2.llir
-rw-r--r--  1 root root 4057 14:45:35 triton_poi_fused_2.ttgir
-rw-r--r--  1 root root 3639 14:45:35 triton_poi_fused_2.ttir
-rw-r--r--  1 root root 4639 14:45:35 triton_poi_fused_2.source

./triton/0/EWE4MJ43HOH7ESTXQZP5T6WKIHZVEHXNEYRKUNP2WE2FPGBSON5A:
total 136
drwxr-xr-x 10 root root  4096 14:45:38 ..
drwxr-xr-x  2 root root  4096 14:45:35 .
-rw-r--r--  1 root root   905 14:45:35 __grp__triton_poi_fused_1.json
-rw-r--r--  1 root root  1115 14:45:35 triton_poi_fused_1.json
-rw-r--r--  1 root root 12568 14:45:35 triton_poi_fused_1.cubin
-rw-r--r--  1 root root 16226 14:45:35 triton_poi_fused_1.ptx
-rw-r--r--  1 root root 14246 14:45:35 triton_poi_fused_1.llir
-rw-r--r--  1 root root 19399 14:45:35 triton_poi_fused_1.ttgir
-rw-r--r--  1 root root 19227 14:45:35 triton_poi_fused_1.ttir
-rw-r--r--  1 root root 29311 14:45:35 triton_poi_fused_1.source

./triton/0/FOACIACBAWZM6JUP45K3XXR3FOZNQQK7LBYTYM3E4WY5ECDVKZEQ:
total 152
drwxr-xr-x 10 root root  4096 14:45:38 ..
drwxr-xr-x  2 root root  4096 14:45:35 .
-rw-r--r--  1 root root   905 14:45:35 __grp__triton_poi_fused_1.json
-rw-r--r--  1 root root  1115 14:45:35 triton_poi_fused_1.json
-rw-r--r--  1 root root 16024 14:45:35 triton_poi_fused_1.cubin
-rw-r--r--  1 root root 19229 14:45:35 triton_poi_fused_1.ptx
-rw-r--r--  1 root root 25401 14:45:35 triton_poi_fused_1.llir
-rw-r--r--  1 root root 19510 14:45:35 triton_poi_fused_1.ttgir
-rw-r--r--  1 root root 19338 14:45:35 triton_poi_fused_1.ttir
-rw-r--r--  1 root root 29454 14:45:35 triton_poi_fused_1.source

./triton/0/6Y4WMALOQ2BSCB4TL5RGGN77IKZSW4MTDWMEIPNINV2UXDSC33BQ:
total 48
drwxr-xr-x 10 root root 4096 14:45:38 ..
drwxr-xr-x  2 root root 4096 14:45:35 .
-rw-r--r--  1 root root  905 14:45:35 __grp__triton_poi_fused_0.json
-rw-r--r--  1 root root 1115 14:45:35 triton_poi_fused_0.json
-rw-r--r--  1 root root 6224 14:45:35 triton_poi_fused_0.cubin
-rw-r--r--  1 root root 4864 14:45:35 triton_poi_fused_0.ptx
-rw-r--r--  1 root root 3382 14:45:35 triton_poi_fused_0.llir
-rw-r--r--  1 root root 3166 14:45:35 triton_poi_fused_0.ttgir
-rw-r--r--  1 root root 2801 14:45:35 triton_poi_fused_0.ttir
-rw-r--r--  1 root root 3015 14:45:35 triton_poi_fused_0.source

./triton/0/T5L6I52ZUBHI5GJRKR7OFJLCNYWA2WHE7QPQJG6O3WHXT5YRAPSQ:
total 52
drwxr-xr-x 10 root root 4096 14:45:38 ..
drwxr-xr-x  2 root root 4096 14:45:35 .
-rw-r--r--  1 root root  905 14:45:35 __grp__triton_poi_fused_0.json
-rw-r--r--  1 root root 1115 14:45:35 triton_poi_fused_0.json
-rw-r--r--  1 root root 6608 14:45:35 triton_poi_fused_0.cubin
-rw-r--r--  1 root root 5260 14:45:35 triton_poi_fused_0.ptx
-rw-r--r--  1 root root 5082 14:45:35 triton_poi_fused_0.llir
-rw-r--r--  1 root root 3185 14:45:35 triton_poi_fused_0.ttgir
-rw-r--r--  1 root root 2820 14:45:35 triton_poi_fused_0.ttir
-rw-r--r--  1 root root 3033 14:45:35 triton_poi_fused_0.source

./l5:
total 12
drwxr-xr-x 9 root root 4096 14:45:35 ..
drwxr-xr-x 2 root root 4096 14:45:35 .
-rw-r--r-- 1 root root 2149 14:45:35 cl5crcucefh6ik2jmow5o4mewlflcrqbain2veghnijm2rvxkwzc.py

./yj:
total 364
drwxr-xr-x 9 root root   4096 14:45:35 ..
drwxr-xr-x 2 root root   4096 14:45:35 .
-rw-r--r-- 1 root root 363691 14:45:35 cyj73pwxtg6je62jejgr5b7noycr5g36kfgfr2bqti6mvqeflrov.py

./cache:
total 12
drwxr-xr-x 9 root root 4096 14:45:35 ..
drwxr-xr-x 2 root root 4096 14:44:05 .
-rw-r--r-- 1 root root 3548 14:44:05 c33ff64252de0fc95aafeb63c22d2f93666cf684f9102841c20702613368c40d
